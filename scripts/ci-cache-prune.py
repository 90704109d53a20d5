#!/usr/bin/env python3
"""Removes this workspace's own build artifacts from the CI build cache.

`.ci/run` keeps `target/` and `fuzz/target/` in a cache outside the clone
(~/.cache/babelqueue-rs/build). Every run builds the clone's own crates anew (the clone's
path differs, so their hashes do), which left each run's copies of them behind: the cache
grew by gigabytes a run until the free-space check started it over and the next run built
everything cold. This removes those copies (the libraries, test and example binaries,
their `.d` files, fingerprints and build-script outputs of this workspace's packages and
of the fuzz package) before the check. The dependencies stay. Removing too much only costs
a rebuild: cargo rebuilds whatever output is missing.

    python3 scripts/ci-cache-prune.py CACHE_DIR [--dry-run]
"""

import json
import os
import re
import shutil
import subprocess
import sys


def own_names(manifest):
    """(package names, target names with '-' as '_') of the workspace at `manifest`."""
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1", "--manifest-path", manifest],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    meta = json.loads(out)
    packages, targets = set(), set()
    for package in meta["packages"]:
        packages.add(package["name"])
        for target in package["targets"]:
            targets.add(target["name"].replace("-", "_"))
    return packages, targets


def main():
    args = [a for a in sys.argv[1:] if a != "--dry-run"]
    dry = "--dry-run" in sys.argv[1:]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    cache = args[0]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    packages, targets = own_names(os.path.join(root, "Cargo.toml"))
    fuzz = os.path.join(root, "fuzz", "Cargo.toml")
    if os.path.exists(fuzz):
        try:
            p, t = own_names(fuzz)
            packages |= p
            targets |= t
        except subprocess.CalledProcessError as e:
            print(f"ci-cache-prune: fuzz manifest not read ({e}); its artifacts stay", file=sys.stderr)
    alt = lambda names: "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    artifact = re.compile(rf"^(?:lib)?(?:{alt(targets)})-[0-9a-f]{{16}}(?:\..+)?$")
    unit_dir = re.compile(rf"^(?:{alt(packages)})-[0-9a-f]{{16}}$")
    freed, removed = 0, 0
    for top in ("target", "fuzz-target"):
        base = os.path.join(cache, top)
        for dirpath, dirnames, filenames in os.walk(base):
            name = os.path.basename(dirpath)
            if name in (".fingerprint", "build"):
                for d in [d for d in dirnames if unit_dir.match(d)]:
                    path = os.path.join(dirpath, d)
                    for p, _, fs in os.walk(path):
                        freed += sum(os.path.getsize(os.path.join(p, f)) for f in fs
                                     if not os.path.islink(os.path.join(p, f)))
                    removed += 1
                    if not dry:
                        shutil.rmtree(path, ignore_errors=True)
                    dirnames.remove(d)
            if name in ("deps", "examples"):
                for f in filenames:
                    path = os.path.join(dirpath, f)
                    if artifact.match(f) and not os.path.islink(path):
                        freed += os.path.getsize(path)
                        removed += 1
                        if not dry:
                            os.remove(path)
    verb = "would free" if dry else "freed"
    print(f"ci-cache-prune: {removed} own artifacts, {verb} {freed / 2**30:.1f} GiB in {cache}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
