"""The dev zoo (issue 16): real models from torchvision and from other toolchains' wheels,
and what graphfix, onnxslim and onnxsim make of each.

    python bench/zoo.py list [--small]
    python bench/zoo.py export [NAMES ...] [--small] [--force]
    python bench/zoo.py run [NAMES ...] [--small] [--tools graphfix,onnxslim,onnxsim] [--runs 1]
    (every command takes --cache DIR; default $GRAPHFIX_ZOO, else ~/.cache/graphfix/zoo)

`export` builds the models into the cache (torch and torchvision: `pip install -e
'.[zoo]'`; the catalogue is `bench/zoo_models.py`, how they are made
`bench/zoo_export.py`). `run` needs no torch: each tool runs on each cached model in a
fresh process (`bench/child.py`, wall time and peak RSS as `bench/run_bench.py` measures
them), then `bench/zoo_eval.py` measures the outputs against the original, and graphfix
runs once more on its own output, which must change nothing. The table goes into
bench/RESULTS.md between the zoo markers, the raw data into a JSON file
(bench/README.md, "Zoo").
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import traceback
from pathlib import Path

import zoo_models
import zoo_run
from zoo_models import ZooModel

HERE = Path(__file__).resolve().parent


def cmd_list(models: list[ZooModel], cache: Path) -> int:
    for spec in models:
        path = cache / spec.file_name
        state = f"{zoo_models.model_mib(path):7.1f} MiB cached" if path.exists() else \
            "    not cached"
        shapes = " ".join(f"{k}:{'x'.join(map(str, v))}" for k, v in spec.check_shapes.items())
        print(f"{spec.name:32} {spec.kind:12} ~{spec.size_mb:5.0f} MiB {state}  {shapes}"
              + (f"  ({spec.note})" if spec.note else ""))
    print(f"cache: {cache}")
    return 0


def cmd_export(models: list[ZooModel], cache: Path, force: bool) -> int:
    """Make every model missing from the cache; a failure is reported, the rest go on."""
    import zoo_export

    failed = []
    for spec in models:
        start = time.perf_counter()
        try:
            path, how = zoo_export.ensure(spec, cache, force)
        except Exception as err:  # one model that does not export must not stop the others
            failed.append(spec.name)
            print(f"FAILED {spec.name}: {type(err).__name__}: {str(err).strip()[:500]}",
                  flush=True)
            traceback.print_exc()
            continue
        finally:
            gc.collect()
        size = zoo_models.model_mib(path)
        print(f"{how:9} {spec.name:32} {size:8.1f} MiB  {time.perf_counter() - start:6.1f} s",
              flush=True)
    if failed:
        print(f"{len(failed)} model(s) failed: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    shared = argparse.ArgumentParser(add_help=False)  # what every command takes
    shared.add_argument("names", nargs="*", help="models (default: all)")
    shared.add_argument("--small", action="store_true",
                        help=f"only models under {zoo_models.SMALL_MB} MiB")
    shared.add_argument("--cache", default=None,
                        help=f"the zoo's folder (default ${zoo_models.CACHE_ENV}, else "
                             f"{zoo_models.DEFAULT_CACHE})")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", parents=[shared], help="the catalogue and what is cached")
    export = commands.add_parser("export", parents=[shared],
                                 help="make the missing models (needs torch, torchvision)")
    export.add_argument("--force", action="store_true", help="make cached ones again")
    zoo_run.add_arguments(commands.add_parser(
        "run", parents=[shared], help="run the tools on cached models; write the table"))
    args = parser.parse_args(argv)
    try:
        models = zoo_models.select(args.names, args.small)
    except ValueError as err:
        parser.error(str(err))
    cache = zoo_models.cache_dir(args.cache)
    if args.command == "list":
        return cmd_list(models, cache)
    if args.command == "export":
        return cmd_export(models, cache, args.force)
    return zoo_run.run(args, models, cache)


if __name__ == "__main__":
    sys.exit(main())
