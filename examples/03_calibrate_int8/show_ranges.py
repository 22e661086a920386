"""Print ranges.json (schema graphfix.ranges/2): per tensor, the range (amax) each
calibration method gives and which one `auto` chose."""

import json

with open("ranges.json") as f:
    ranges = json.load(f)

methods = list(next(iter(ranges["tensors"].values()))["amax"])
print(f"{ranges['schema']}; recommended: {ranges['recommended']}")
print(f"{'tensor':<18}{'observed':>10}" + "".join(f"{m:>12}" for m in methods) + "  auto chose")
for name, t in ranges["tensors"].items():
    row = "".join(f"{t['amax'][m]:>12.4f}" for m in methods)
    print(f"{name:<18}{t['amax_observed']:>10.4f}{row}  {t['chosen'].get('auto', '-')}")
