"""A Python policy that misbehaves on request (the `mode` parameter), for
the end-to-end tests of what the host makes of it: a traceback, a socket,
a loop, an allocation past the memory cap, print debugging."""

import socket

import nyann_policy as nyann
from nyann_policy import Params, spec


def nested(depth):
    if depth == 0:
        raise ValueError("judge exploded on purpose")
    return nested(depth - 1)


class Hostile:
    def describe(self):
        return (
            nyann.info("py-hostile", "0.1.0", "Misbehaves as `mode` says.")
            .client_only()
            .param(spec.text("mode", "what to do").default("ok"))
        )

    def judge(self, params: Params, stage, history):
        mode = params.text("mode")
        print(f"judging {stage.name} in mode {mode}")
        if mode == "raise":
            nested(2)
        if mode == "socket":
            socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(("127.0.0.1", 9))
        if mode == "loop":
            n = 0
            while True:
                n += 1
        if mode == "alloc":
            hoard = []
            while True:
                hoard.append(bytearray(1 << 20))
        if mode == "err":
            raise nyann.PolicyError("no verdict today")
        return nyann.congested(f"mode {mode}")


Policy = nyann.export(Hostile)
