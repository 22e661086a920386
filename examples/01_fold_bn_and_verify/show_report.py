"""Read the JSON report `graphfix run --report` wrote (schema graphfix.run/1) and say what
each pass did; exit 1 unless fold-bn was applied and its numerical check passed."""

import json
import sys

path = sys.argv[1] if len(sys.argv) > 1 else "report.json"
with open(path) as f:
    report = json.load(f)

print(f"{report['schema']}: {report['pipeline']}, "
      f"{report['nodes_before']} -> {report['nodes_after']} nodes")
for record in report["passes"]:
    counts = "; ".join(f"{what} ({n})" for what, n in record["counts"].items()) or "-"
    print(f"  {record['spec']:<8} {record['status']:<11} {counts}  check: {record['check']}")

fold_bn = next(r for r in report["passes"] if r["spec"] == "fold-bn")
if fold_bn["status"] != "applied" or not fold_bn["check"].startswith("passed"):
    sys.exit(f"fold-bn was not applied with a passing check: {fold_bn}")
print("fold-bn: applied, outputs checked against the original")
