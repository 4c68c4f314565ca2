"""``python -m treadle.dashboards [--check]``: write (or verify) the dashboards' JSON files."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from treadle.dashboards import catalog, model

OUT_DIR = Path(__file__).resolve().parents[2] / "charts" / "treadle" / "dashboards"


def rendered() -> dict[str, str]:
    """File name -> JSON text of every dashboard, exactly as committed."""
    return {
        f"{d.uid}.json": json.dumps(model.render(d), indent=2, sort_keys=True) + "\n" for d in catalog.ALL
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m treadle.dashboards")
    parser.add_argument("--check", action="store_true", help="fail if the committed files are out of date")
    args = parser.parse_args()
    files = rendered()
    if args.check:
        stale = [
            n for n, text in files.items() if not (OUT_DIR / n).is_file() or (OUT_DIR / n).read_text() != text
        ]
        if stale:
            print(f"dashboards out of date, run `python -m treadle.dashboards`: {stale}", file=sys.stderr)
            return 1
        return 0
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (OUT_DIR / name).write_text(text)
    print(f"wrote {len(files)} dashboards to {OUT_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
