#!/usr/bin/env python3
"""registry_serve.py DIR HOST_FILE - a plain-HTTP docker-registry on 127.0.0.1
for run_bench.sh --registry (tests/e2e/registry.py starts it), its storage in
DIR; writes host:port to HOST_FILE once it answers and serves until SIGTERM."""
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "e2e"))
import registry  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    reg = registry.Registry(sys.argv[1], "plain")
    reg.start()

    def stop(*_):
        reg.close()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with open(sys.argv[2] + ".tmp", "w") as f:
        f.write(reg.host + "\n")
    os.rename(sys.argv[2] + ".tmp", sys.argv[2])
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
