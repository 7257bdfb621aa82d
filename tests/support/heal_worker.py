"""A rank that keeps calling all_reduce until STOP_FILE exists (the ranks agree on when:
the flag itself is all-reduced), at most 90 s. ``python heal_worker.py STOP_FILE``.
"""

import os
import sys
import time

import numpy as np

import cclctl


def main() -> None:
    stop_file = sys.argv[1]
    comm = cclctl.init()
    deadline = time.monotonic() + 90
    flag = np.zeros(1, np.int32)
    while True:
        flag[0] = os.path.exists(stop_file) or time.monotonic() > deadline
        comm.all_reduce(flag, op="max")
        if flag[0]:
            break
        time.sleep(0.02)
    comm.close()


if __name__ == "__main__":
    main()
