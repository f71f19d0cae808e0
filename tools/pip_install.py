"""``pip install`` with whole-command retries: tox's install command (tox.ini).

pip retries a broken connection within one process, resuming the download where it stopped. A download that the
server keeps cutting at the same byte still fails that process, and with it the environment: the support matrix's
CUDA builds are ~2.5 GB per environment, and one such network fault failed a whole CI run. A fresh pip process after
a pause requests the files anew. A real failure (a version that does not exist, a conflict) fails every attempt and
costs the pauses, about a minute and a half.

    python tools/pip_install.py [pip install arguments]
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Sequence

#: seconds to wait before each retry; one more attempt than pauses
PAUSES_S = (15.0, 60.0)


def install(
    arguments: Sequence[str],
    run: Callable[[list[str]], int] = subprocess.call,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Run ``pip install arguments``, again after each pause of :data:`PAUSES_S` while it fails; its last exit code."""
    command = [sys.executable, "-m", "pip", "install", *arguments]
    code = run(command)
    for attempt, pause in enumerate(PAUSES_S, start=1):
        if code == 0:
            break
        print(
            f"pip_install: pip exited with {code} (attempt {attempt} of {len(PAUSES_S) + 1}); again in {pause:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        sleep(pause)
        code = run(command)
    return code


if __name__ == "__main__":
    sys.exit(install(sys.argv[1:]))
