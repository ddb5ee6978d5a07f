"""Create a virtual environment that sees the packages of the interpreter running this script.

One promise: `python tools/oracle/shared_venv.py DIR` leaves in DIR a virtual environment whose own installs
shadow, in order, the running interpreter's site-packages and then the base interpreter's, even when the
running interpreter is itself a virtual environment.

Why: `python -m venv --system-site-packages` only exposes the *base* interpreter's site-packages. Run from
a newcomer's venv (`python3 -m venv venv; . venv/bin/activate; pip install -e .`), that hides the venv's
torch, so installing the oracle's requirements would pull a second torch into the oracle venv. A `.pth`
file in the new venv adds the running interpreter's site directories with `site.addsitedir`, which also
processes their own `.pth` files (editable installs and the like), after the new venv's own packages.
"""

from __future__ import annotations

import argparse
import site
import sys
import sysconfig
import venv
from pathlib import Path

PTH_NAME = "_vivace_parent_site.pth"


def parent_site_dirs() -> list[str]:
    """The running interpreter's site-packages directories (a venv's own first, then any it inherits)."""
    dirs = [*site.getsitepackages(), sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    seen: list[str] = []
    for d in dirs:
        if d not in seen and Path(d).is_dir():
            seen.append(d)
    return seen


def venv_site_packages(target: Path) -> Path:
    """The site-packages directory of the (Linux) venv at `target`, made by this interpreter's version."""
    return target / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def create(target: Path, *, with_pip: bool = True) -> Path:
    """Create (or update) the venv at `target`; returns the `.pth` file linking the parent's packages."""
    if not (target / "bin" / "python").exists():
        venv.EnvBuilder(system_site_packages=True, with_pip=with_pip, symlinks=True).create(target)
    site_packages = venv_site_packages(target)
    site_packages.mkdir(parents=True, exist_ok=True)
    lines = [f"import site; site.addsitedir({d!r})" for d in parent_site_dirs()]
    pth = site_packages / PTH_NAME
    pth.write_text("\n".join(lines) + "\n")
    return pth


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    parser.add_argument("target", type=Path, help="directory of the virtual environment")
    parser.add_argument("--without-pip", action="store_true", help="do not install pip into it")
    args = parser.parse_args(argv)
    pth = create(args.target, with_pip=not args.without_pip)
    print(f"{args.target}: sees {sys.prefix}'s packages through {pth.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
