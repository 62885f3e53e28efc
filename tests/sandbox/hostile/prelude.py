# Prepended to every attack in this folder: how an attack reports, and a harmless ModelNew for
# causal_conv1d so that the compile phase reaches the end. Each attack runs at import time and prints
# `ATTACK reached: STEP` as soon as it gets to a point of attack (found its target, started its processes),
# and at the end one line, ATTACK {json}, with what each attempt got:
#   "blocked: ENOENT: ..."   an OSError from the system: the test expects a given errno per attempt;
#   "blocked: Refused: ..."  the attack saw the defence itself (a file read back empty, a secret absent);
#   "ERROR: NameError: ..."  the attack failed on its own: never counted as blocked;
#   "ESCAPED: ..."           the attempt got through.
import errno
import json
import os
import sys

import torch.nn as nn

OUTCOMES = {}


class Refused(Exception):
    """The attempt met the defence without an error of the system's, as the attack can tell."""


def reached(step):
    print(f"ATTACK reached: {step}", flush=True)


def attempt(name, action):
    """Run one attempt; what it returns means it got through."""
    try:
        got = action()
    except Refused as exc:
        OUTCOMES[name] = f"blocked: Refused: {exc}"[:300]
    except OSError as exc:
        code = errno.errorcode.get(exc.errno, type(exc).__name__) if exc.errno else type(exc).__name__
        OUTCOMES[name] = f"blocked: {code}: {exc}"[:300]
    except MemoryError as exc:
        OUTCOMES[name] = f"blocked: MemoryError: {exc}"[:300]
    except BaseException as exc:  # noqa: BLE001 - the attack's own failure, reported as such
        OUTCOMES[name] = f"ERROR: {type(exc).__name__}: {exc}"[:300]
    else:
        OUTCOMES[name] = f"ESCAPED: {got!r}"[:300]


def report():
    print("ATTACK " + json.dumps(OUTCOMES), flush=True)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, dilation=1, bias=False):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, bias=bias)

    def forward(self, x):
        return self.conv(nn.functional.pad(x, ((self.conv.kernel_size[0] - 1) * self.conv.dilation[0], 0)))
