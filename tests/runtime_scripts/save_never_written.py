"""Rank 1 loads a path it saved, which the main process never writes (it skips the save).

The wait for the main process's write must end after the job's timeout (DISTIFY_TIMEOUT) with
a DistifyError naming the file, not hang. Rank 1 prints what it caught.
"""

import distify.runtime as distify

distify.init()
if distify.rank() == 1:
    distify.save({"step": 1}, "never.pt")
    try:
        distify.load("never.pt")
    except distify.DistifyError as err:
        print(f"caught: {err}", flush=True)
