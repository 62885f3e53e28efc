# Prepended to every attack in this folder: how an attack reports, and a harmless ModelNew for
# causal_conv1d so that the compile phase reaches the end. Each attack runs at import time, records
# what each attempt got ("blocked: ..." or "ESCAPED: ...") and prints one line, ATTACK {json}.
import json
import os
import sys

import torch.nn as nn

OUTCOMES = {}


def attempt(name, action):
    """Run one attempt; anything it returns means it got through, an OSError or similar that it did not."""
    try:
        got = action()
    except BaseException as exc:  # noqa: BLE001 - a refusal of any kind is what we want to see
        OUTCOMES[name] = f"blocked: {type(exc).__name__}: {exc}"[:300]
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
