#!/usr/bin/env python3
"""Checks of perf/compare_gpu.py and of torch_attention.py's SDPA case logic that need no GPU:
the peak table, the targets' verdicts, the join of the two JSON files, a whole dry run, and the
backend fallback of torch_attention.cuda_case with SDPA and CUDA replaced by CPU stand-ins.

  python3 perf/test_compare_gpu.py
"""
import contextlib
import json
import os
import sys
import tempfile
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import compare_gpu  # noqa: E402


def args(extra=()):
    return compare_gpu.parse_args(["--dry-run", *extra])


def row(pass_, t, n, kfa, sdpa, backend="flash", d=64, causal=0, peak=None):
    return {"pass": pass_, "type": t, "B": 16384 // n, "H": 16, "N": n, "D": d,
            "causal": causal, "kfa_gflops": kfa, "sdpa_gflops": sdpa, "sdpa_backend": backend,
            "kfa_over_sdpa": compare_gpu.ratio(kfa, sdpa),
            "kfa_over_fp32_peak": compare_gpu.ratio(kfa, peak * 1e3) if peak else None}


class Peak(unittest.TestCase):
    def test_table(self):
        for name, want in (("NVIDIA H200", 66.9), ("NVIDIA H200 NVL", 60.0),
                           ("NVIDIA GH200 480GB", 66.9), ("NVIDIA H100 PCIe", 51.2),
                           ("NVIDIA H100 80GB HBM3", 66.9), ("NVIDIA A100-SXM4-80GB", 19.5),
                           ("NVIDIA A100 80GB PCIe", 19.5)):
            self.assertEqual(compare_gpu.fp32_peak(name, {})[0], want, name)

    def test_override_and_estimate(self):
        self.assertEqual(compare_gpu.fp32_peak("NVIDIA H200", {}, 50.0)[0], 50.0)
        ctx = {"capability": "8.9", "multi_processor_count": 142}
        tflops, source = compare_gpu.fp32_peak("NVIDIA L40S", ctx, None, 2520.0)
        self.assertAlmostEqual(tflops, 142 * 128 * 2 * 2.52e9 / 1e12)
        self.assertIn("estimated", source)
        self.assertIsNone(compare_gpu.fp32_peak("NVIDIA L40S", ctx, None, None)[0])

    def test_slug(self):
        self.assertEqual(compare_gpu.slug("NVIDIA H200"), "h200")
        self.assertEqual(compare_gpu.slug("NVIDIA A100-SXM4-80GB"), "a100-sxm4-80gb")


class Targets(unittest.TestCase):
    def verdicts(self, rows, peak=66.9):
        return {t["target"]: t for t in compare_gpu.check_targets(rows, peak)}

    def test_pass_miss_and_not_measured(self):
        rows = [row("fwd", "float", 4096, 30e3, 20e3, "efficient", peak=66.9),
                row("fwd", "float", 8192, 27e3, 20e3, "efficient", peak=66.9),
                row("fwd", "bf16", 4096, 290e3, 390e3), row("fwd", "bf16", 8192, 300e3, 400e3),
                row("fwd_bwd", "bf16", 4096, 100e3, 260e3)]
        v = self.verdicts(rows)
        self.assertEqual(v["float-forward-peak"]["verdict"], "PASS")  # 0.448 and 0.404
        self.assertEqual(v["bf16-forward-sdpa"]["verdict"], "PASS")  # 0.744 and 0.75
        self.assertEqual(v["bf16-forward-backward-sdpa"]["verdict"], "MISS")  # 0.385
        self.assertEqual(v["half-forward-sdpa"]["verdict"], "NOT MEASURED")
        self.assertEqual(v["bf16-forward-sdpa"]["cases"], 2)
        self.assertEqual(v["bf16-forward-sdpa"]["worst_case"]["N"], 4096)

    def test_one_case_below_misses(self):
        rows = [row("fwd", "float", n, g, None, peak=66.9) for n, g in
                ((1024, 20e3), (2048, 30e3), (4096, 40e3))]
        v = self.verdicts(rows)["float-forward-peak"]
        self.assertEqual((v["verdict"], v["passing"], v["cases"]), ("MISS", 2, 3))

    def test_only_flash_counts(self):
        rows = [row("fwd", "bf16", 4096, 200e3, 390e3, backend="efficient")]
        v = self.verdicts(rows)["bf16-forward-sdpa"]
        self.assertEqual(v["verdict"], "NOT MEASURED")
        self.assertIn("flash", v["why"])

    def test_no_peak(self):
        v = self.verdicts([row("fwd", "float", 4096, 30e3, 20e3)], peak=None)
        self.assertEqual(v["float-forward-peak"]["verdict"], "NOT MEASURED")


class Join(unittest.TestCase):
    def test_rows_from_files(self):
        a = compare_gpu.parse_args(["--n", "1024,2048", "--d", "64", "--causal", "0",
                                    "--types", "float", "--passes", "fwd"])
        name = "BM_kfa_fwd<float>/B:{}/H:16/N:{}/D:64/causal:0/manual_time"
        bench = [
            # two repetitions and their median aggregate: the median is used
            {"name": name.format(16, 1024), "run_name": name.format(16, 1024),
             "run_type": "iteration", "real_time": 9.0, "time_unit": "ms", "FLOP/s": 1e13},
            {"name": name.format(16, 1024) + "_median", "run_name": name.format(16, 1024),
             "run_type": "aggregate", "aggregate_name": "median", "real_time": 8.0,
             "time_unit": "ms", "FLOP/s": 2e13},
            {"name": name.format(16, 1024) + "_mean", "run_name": name.format(16, 1024),
             "run_type": "aggregate", "aggregate_name": "mean", "real_time": 7.0,
             "time_unit": "ms", "FLOP/s": 3e13},
            {"name": name.format(8, 2048), "run_name": name.format(8, 2048),
             "run_type": "iteration", "real_time": 20.0, "time_unit": "ms", "FLOP/s": 1.5e13},
        ]
        torch_results = [
            {"pass": "fwd", "type": "float", "B": 16, "H": 16, "N": 1024, "D": 64, "causal": 0,
             "seconds": 0.004, "flops_per_s": 4e13, "backend": "efficient"},
            {"pass": "fwd", "type": "float", "B": 8, "H": 16, "N": 2048, "D": 64, "causal": 0,
             "skipped": "no SDPA backend took it: math: too big"},
        ]
        with tempfile.TemporaryDirectory() as tmp:
            kp, tp = os.path.join(tmp, "k.json"), os.path.join(tmp, "t.json")
            with open(kp, "w") as f:
                json.dump({"context": {"kokkos_execution_space": "Cuda"}, "benchmarks": bench}, f)
            with open(tp, "w") as f:
                json.dump({"context": {"sgemm": {"n": 8192, "flops_per_s": 5e13}},
                           "results": torch_results}, f)
            rows, kctx, tctx, sgemm = compare_gpu.build_rows(a, kp, tp, 66.9)
        self.assertEqual(len(rows), 2)
        r0, r1 = rows
        self.assertEqual(r0["kfa_gflops"], 2e4)
        self.assertEqual(r0["kfa_ms"], 8.0)
        self.assertAlmostEqual(r0["kfa_over_sdpa"], 0.5)
        self.assertAlmostEqual(r0["kfa_over_fp32_peak"], 20.0 / 66.9)
        self.assertAlmostEqual(r0["kfa_over_sgemm"], 0.4)
        self.assertIsNone(r1["sdpa_gflops"])
        self.assertIn("skipped", "skipped " + r1["sdpa_note"])
        self.assertIsNone(r1["kfa_over_sdpa"])


class Repair(unittest.TestCase):
    def test_cut_short(self):
        full = {"context": {"x": {"y": 1}}, "benchmarks": [
            {"name": "BM_kfa_fwd<float>/B:1/H:1/N:1/D:1/causal:0", "real_time": 1.0},
            {"name": "BM_kfa_fwd<float>/B:1/H:1/N:2/D:1/causal:0", "real_time": 2.0}]}
        text = json.dumps(full, indent=2)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "k.json")
            for cut, kept in ((text.rfind('"real_time": 2.0'), 1), (len(text) - 6, 2)):
                with open(path, "w") as f:
                    f.write(text[:cut])
                compare_gpu.repair_json(path)
                with open(path) as f:
                    self.assertEqual(len(json.load(f)["benchmarks"]), kept)


class DryRun(unittest.TestCase):
    def test_whole_run(self):
        with tempfile.TemporaryDirectory() as tmp:
            targets = compare_gpu.main(["--dry-run", "--out-dir", tmp, "--date", "2000-01-01"],
                                       "python3 perf/compare_gpu.py --dry-run")
            v = {t["target"]: t["verdict"] for t in targets}
            self.assertEqual(v, {"float-forward-peak": "MISS", "bf16-forward-sdpa": "PASS",
                                 "half-forward-sdpa": "PASS",
                                 "bf16-forward-backward-sdpa": "MISS"})
            stem = os.path.join(tmp, "2000-01-01-gpu-h200-dry-run-synthetic-data")
            with open(stem + ".md") as f:
                md = f.read()
            self.assertIn("Dry run", md)
            self.assertEqual(md.count("| float | 64 | no | 1024 | 16 |"), 3)  # one per pass
            with open(stem + ".json") as f:
                summary = json.load(f)
            self.assertEqual(len(summary["cases"]), 3 * 3 * 2 * 2 * 5)
            self.assertEqual(summary["fp32_peak_tflops"], 66.9)
            self.assertIn("- Dropout: p = 0.0 (none)", md)

    def test_dropout_is_stated_and_checked(self):
        with tempfile.TemporaryDirectory() as tmp:
            compare_gpu.main(["--dry-run", "--out-dir", tmp, "--date", "2000-01-01",
                              "--dropout", "0.1", "--passes", "fwd"], "dry run")
            stem = os.path.join(tmp, "2000-01-01-gpu-h200-dry-run-synthetic-data")
            with open(stem + ".md") as f:
                md = f.read()
            self.assertIn("- Dropout: p = 0.1 on both sides", md)
            self.assertNotIn("results say otherwise", md)
            with open(stem + ".json") as f:
                self.assertEqual(json.load(f)["dropout"], 0.1)
            # A side reused from a run without dropout is named.
            compare_gpu.main(["--dry-run", "--out-dir", tmp, "--date", "2000-01-01",
                              "--dropout", "0.2", "--passes", "fwd", "--reuse"], "dry run")
            with open(stem + ".md") as f:
                self.assertIn("kfa ran p = 0.1, SDPA p = 0.1", f.read())


class TorchCase(unittest.TestCase):
    """torch_attention.cuda_case's choice of backend, with SDPA and CUDA replaced by CPU
    stand-ins: flash refuses float32, as PyTorch's does."""

    def setUp(self):
        try:
            import torch
        except ImportError:
            self.skipTest("no torch")
        import torch_attention as ta
        self.ta, self.torch = ta, torch
        self.saved = {k: getattr(ta, k) for k in ("sdpa", "sdpa_context", "cuda_inputs",
                                                   "timed_cuda")}
        self.active = []

        @contextlib.contextmanager
        def context(name):
            self.active.append(name)
            yield
            self.active.pop()

        self.dropouts = []

        def sdpa(q, k, v, causal, dropout=0.0):
            self.dropouts.append(dropout)
            if self.active[-1] == "flash" and q.dtype == torch.float32:
                raise RuntimeError("No available kernel. Aborting execution.")
            return ta.attention(q, k, v, causal)

        def timed(call, warmup, repeats, min_time):
            sec, iters = ta.timed(call, 0.0)
            return sec, iters, sec

        ta.sdpa, ta.sdpa_context, ta.timed_cuda = sdpa, context, timed
        ta.cuda_inputs = lambda b, h, n, d, dtype, grad: ta.inputs(b, h, n, d, dtype, grad)
        self.a = types.SimpleNamespace(warmup=1, repeats=1, min_time=0.0, budget_gib=1.0,
                                       dropout=0.0)

    def tearDown(self):
        for k, v in self.saved.items():
            setattr(self.ta, k, v)

    def case(self, pass_, backends, n=64):
        return self.ta.cuda_case(pass_, self.torch.float32, 2, 2, n, 16, True, backends, self.a)

    def test_dropout_reaches_every_call(self):
        self.a.dropout = 0.1
        for pass_ in ("fwd", "bwd", "fwd_bwd"):
            self.dropouts.clear()
            self.case(pass_, ["efficient"])
            self.assertTrue(self.dropouts, pass_)
            self.assertEqual(set(self.dropouts), {0.1}, pass_)

    def test_fallback_is_recorded(self):
        for pass_ in ("fwd", "bwd", "fwd_bwd"):
            r = self.case(pass_, ["flash", "efficient"])
            self.assertEqual(r["backend"], "efficient", pass_)
            self.assertIn("flash: No available kernel", r["note"])
            self.assertGreater(r["flops_per_s"], 0)

    def test_first_backend_taken(self):
        r = self.case("fwd", ["math"])
        self.assertEqual(r["backend"], "math")
        self.assertNotIn("note", r)

    def test_nothing_takes_it(self):
        self.a.budget_gib = 1e-6
        r = self.case("fwd", ["flash", "math"])
        self.assertNotIn("backend", r)
        self.assertIn("math: N x N tensors need", r["skipped"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
