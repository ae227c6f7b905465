"""The ``*-graph`` engines: any engine's call captured in a CUDA graph and replayed.

A graph bakes in the buffer addresses it was captured with, so there is one graph per distinct set
of (input, output) buffers, keyed by their data pointers and shapes, captured on first use. Later
calls with the same buffers replay it and read whatever the inputs hold *now*: the changed-input
replay check (``validation.owned_graph_replay``) proves it. All graphs of one engine share a
memory pool; they run one at a time on one stream, so their temporaries never overlap in time.
"""

from __future__ import annotations

from collections import OrderedDict

MAX_GRAPHS = 128
"""Kept per engine, least recently used dropped first (the harness rotates up to 64 buffer sets)."""


class GraphCall:
    def __init__(self, call):
        self.call = call
        self.graphs: OrderedDict = OrderedDict()
        self.pool = None

    @staticmethod
    def key(inputs: dict, outputs: dict) -> tuple:
        return tuple((name, t.data_ptr(), *t.shape) for name, t in (*inputs.items(), *outputs.items()))

    def __call__(self, inputs: dict, outputs: dict) -> dict:
        key = self.key(inputs, outputs)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self.capture(inputs, outputs)
            while len(self.graphs) > MAX_GRAPHS:
                self.graphs.popitem(last=False)
        else:
            self.graphs.move_to_end(key)
        graph, result = entry
        graph.replay()
        return result

    def capture(self, inputs: dict, outputs: dict):
        """Warm up on a side stream (first-call compilation and allocations stay out of the graph),
        then capture one call. Returns (graph, the call's result dict)."""
        import torch

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.call(inputs, outputs)
        torch.cuda.current_stream().wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            result = self.call(inputs, outputs)
        return graph, result
