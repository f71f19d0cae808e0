"""``pip install`` with whole-command retries: tox's install command (tox.ini).

pip retries a broken connection within one process, resuming the download where it stopped. A download that ends
short at the same byte every time still fails that process, and with it the environment: the support matrix's CUDA
builds are ~2.5 GB per environment, and such a failure ended a whole CI run (a second environment's download of a
file the first had fetched). The same was seen here on a nearly full disk, where pip's cache held a cut-off copy. A
fresh pip process after a pause requests the files anew, bypassing pip's cache (``--no-cache-dir``). A real failure
(a version that does not exist, a conflict) fails every attempt and costs the pauses, about a minute and a half.

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
    """Run ``pip install arguments``, again without pip's cache after each pause of :data:`PAUSES_S` while it fails.

    Returns:
        pip's last exit code.

    """
    command = [sys.executable, "-m", "pip", "install", *arguments]
    code = run(command)
    command = [*command[:4], "--no-cache-dir", *command[4:]]  # the retries: no cached copy, which may be cut off
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
