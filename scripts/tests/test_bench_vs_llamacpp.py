"""scripts/bench-vs-llamacpp-cuda end to end without a GPU: llama.cpp's build (cmake), its two
tools, memra-engine and nvidia-smi are stand-ins that print what the real ones print, so the
script's building, measuring, parsing and table are what is tested."""

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench-vs-llamacpp-cuda"


def executable(path, body):
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# llama-bench: one JSON row per test, the logs on stderr (as the real one writes them).
LLAMA_BENCH = r'''
import json, sys
a = sys.argv
p = [int(x) for x in a[a.index("-p") + 1].split(",")]
n = int(a[a.index("-n") + 1])
d = int(a[a.index("-d") + 1]) if "-d" in a else 0
print("load_backend: loaded CUDA backend [not JSON]", file=sys.stderr)
rows = []
for pp in p:
    if pp:
        rows.append({"n_prompt": pp, "n_gen": 0, "n_depth": d, "avg_ts": pp * 9.0,
                     "samples_ts": [pp * 8.0, pp * 10.0]})
if n:
    rows.append({"n_prompt": 0, "n_gen": n, "n_depth": d,
                 "avg_ts": 300.0 if d else 380.0,
                 "samples_ts": [310.0, 320.0] if d else [385.0, 390.0]})
print(json.dumps(rows, indent=2))
'''

# llama-batched-bench: its table on stderr, as some versions print it.
BATCHED = r'''
import sys
out = sys.stderr
print("|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |", file=out)
print("|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|", file=out)
for b, tg in [(1, 340.0), (8, 1400.0), (16, 2300.0), (64, 4600.0)]:
    print(f"|   128 |     32 | {b:4} |  {b*160:5} |    0.020 |  6400.00 |    0.100 | {tg:8.2f} |    0.120 |  1000.00 |", file=out)
'''

CMAKE = r'''
import os, sys
from pathlib import Path
a = sys.argv
if "-S" in a:
    b = Path(a[a.index("-B") + 1])
    (b / "build.ninja").write_text("")
    with open(b / "configured", "a") as f:
        f.write("x")
    sys.exit(0)
b = Path(a[a.index("--build") + 1]) / "bin"
b.mkdir(exist_ok=True)
for name, env in (("llama-bench", "FAKE_LLAMA_BENCH"), ("llama-batched-bench", "FAKE_BATCHED")):
    (b / name).write_text(Path(os.environ[env]).read_text())
    (b / name).chmod(0o755)
'''

ENGINE = r'''
import os, sys
from pathlib import Path
a = sys.argv
if os.environ.get("MEMRA_BACKEND") != "cuda" or "MEMRA_FA3" in os.environ:
    sys.exit("the bench must run with MEMRA_BACKEND=cuda and no other MEMRA_ setting")
if os.environ.get("CUDA_VISIBLE_DEVICES") != "3":
    sys.exit("one GPU, the first of CUDA_VISIBLE_DEVICES")
if a[1] == "synth":
    Path(a[a.index("--out") + 1]).write_bytes(b"GGUF")
    sys.exit(0)
if "--door-matrix" in a:
    ctx = int(a[a.index("--context") + 1])
    print("memra-engine bench --door-matrix: m on NVIDIA H200 (device 0)")
    print("| doors                    | graphs | B  | tokens/s  | ms/step | weight GB/s | % of copy | vs B=1 |")
    print("|--------------------------|--------|----|-----------|---------|-------------|-----------|--------|")
    for b in [int(x) for x in a[a.index("--batch") + 1].split(",")]:
        rate = (600.0 if ctx <= 128 else 330.0) * (b if b < 16 else b / 2)
        print(f"| mmvq=1 nofuse=0 fa3=1    | yes    | {b:2} | {rate:9.0f} |   1.000 |        2500 |     59.0% |   1.0x |")
        print(f"| mmvq=1 nofuse=0 fa3=0    | yes    | {b:2} | {1.0:9.0f} |   1.000 |        2500 |     59.0% |   1.0x |")
    print("| mmvq=1 nofuse=0 fa3=1 b1fast=1 | yes    |  1 |         2 |   1.000 |        2500 |     59.0% |   1.0x |")
    print("| mmvq=1 nofuse=0 fa3=1    | no     |  1 |         3 |   1.000 |        2500 |     59.0% |   1.0x |")
    sys.exit(0)
p = int(a[a.index("--prompt-len") + 1])
if os.environ.get("FAKE_NO_PREFILL"):
    sys.exit(0)
print("backend: cuda")
print("| measurement | tokens | best s | tokens/s | cpu s | tokens/cpu-s |")
print("|-------------|--------|--------|----------|-------|--------------|")
print(f"| prefill (prime, {p} tokens) | {p} | 0.0100 | {p * 50.0:9.1f} | 0.0100 | 1.0 |")
print("| decode B=1 (plain generate's step: decode_step_batch at B=1, 1 steps) | 1 | 0.0010 | 1000.0 | 0.0010 | 1.0 |")
'''

NVIDIA_SMI = r'''
import sys
assert sys.argv[sys.argv.index("-i") + 1] == "3"
print("NVIDIA H200, 580.159.04")
'''


def setup(tmp):
    src = tmp / "llama.cpp"
    for d in ("ggml", "tools/llama-bench", "tools/batched-bench"):
        (src / d).mkdir(parents=True)
    (src / "CMakeLists.txt").write_text("project(llama)\n")
    bin_ = tmp / "bin"
    bin_.mkdir()
    executable(bin_ / "cmake", CMAKE)
    executable(bin_ / "nvidia-smi", NVIDIA_SMI)
    engine = executable(tmp / "memra-engine", ENGINE)
    env = dict(os.environ)
    env.update({
        "PATH": f"{bin_}:{env['PATH']}",
        "FAKE_LLAMA_BENCH": str(executable(tmp / "lb", LLAMA_BENCH)),
        "FAKE_BATCHED": str(executable(tmp / "bb", BATCHED)),
        "XDG_CACHE_HOME": str(tmp / "cache"),
        "CUDA_VISIBLE_DEVICES": "3,5",
        "MEMRA_FA3": "0",
    })
    return src, engine, env


def bench(src, engine, env, tmp, *extra):
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(src), "--engine", str(engine), "--reps", "2",
         "--shapes", "llama-7b", "--logs", str(tmp / "logs"), *extra],
        env=env, capture_output=True, text=True)


def test_one_table_memra_beside_llama_cpp_with_the_ratio(tmp_path):
    src, engine, env = setup(tmp_path)
    out = bench(src, engine, env, tmp_path)
    assert out.returncode == 0, out.stderr
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:6]]
            for line in out.stdout.splitlines() if line.startswith("| ")}
    assert "on NVIDIA H200, 580.159.04" in out.stdout
    # memra's default doors with graphs at context 128; llama.cpp's best of tg32 (its best
    # sample, 390) and batched-bench's B=1 (340).
    assert rows["decode B=1"] == ["600", "390", "1.54×", "llama-bench tg32"]
    assert rows["decode B=8"] == ["4,800", "1,400", "3.43×", "batched-bench S_TG, one run"]
    assert rows["decode B=64"] == ["19,200", "4,600", "4.17×", "batched-bench S_TG, one run"]
    # Prefill: memra's prime against llama-bench's best sample (10 × P).
    assert rows["prefill 512"] == ["25,600", "5,120", "5.00×", "llama-bench pp512"]
    assert rows["decode B=1 at context 2048"] == ["330", "320", "1.03×",
                                                  "llama-bench tg32 -d 2048"]
    # The build is kept: a second run configures nothing again.
    assert bench(src, engine, env, tmp_path).returncode == 0
    configured = list((tmp_path / "cache/memra/llama.cpp-cuda").glob("*/configured"))
    assert [c.read_text() for c in configured] == ["x"]
    # Another architecture is built apart; in a build folder given, it is configured again.
    assert bench(src, engine, env, tmp_path, "--arch", "100").returncode == 0
    assert len(list((tmp_path / "cache/memra/llama.cpp-cuda").glob("*/configured"))) == 2
    for arch in ("90", "90", "100"):
        assert bench(src, engine, env, tmp_path, "--arch", arch, "--build",
                     str(tmp_path / "b")).returncode == 0
    assert (tmp_path / "b/configured").read_text() == "xx"


def test_a_missing_row_fails_naming_its_log_and_bad_input_is_refused(tmp_path):
    src, engine, env = setup(tmp_path)
    out = bench(src, engine, dict(env, FAKE_NO_PREFILL="1"), tmp_path)
    assert out.returncode == 3
    assert "printed no prefill row" in out.stderr and "memra-prefill-llama-7b-128.log" in out.stderr
    out = bench(tmp_path, engine, env, tmp_path)
    assert out.returncode == 2 and "not a llama.cpp source folder" in out.stderr
    out = bench(src, tmp_path / "nope", env, tmp_path, "--engine", str(tmp_path / "nope"))
    assert out.returncode == 2 and "no memra-engine" in out.stderr


# ---------------------------------------------------------------- the CPU script

CPU_SCRIPT = SCRIPT.with_name("bench-vs-llamacpp")

# Each call counts itself, so the rounds differ: the table must keep each engine's best.
CPU_ENGINE = r'''
import os, sys
from pathlib import Path
a = sys.argv
if a[1] == "synth":
    Path(a[a.index("--out") + 1]).write_bytes(b"GGUF")
    sys.exit(0)
if os.environ.get("MEMRA_BACKEND") != "cpu" or "MEMRA_FA3" in os.environ:
    sys.exit("the CPU bench must run with MEMRA_BACKEND=cpu and no other MEMRA_ setting")
t = int(os.environ["RAYON_NUM_THREADS"])
if len(os.sched_getaffinity(0)) != t:
    sys.exit(f"pinned to {os.sched_getaffinity(0)} for {t} threads")
count = Path(os.environ["FAKE_COUNT"])
n = int(count.read_text()) if count.exists() else 0
count.write_text(str(n + 1))
bump = 10.0 if n == 2 else 0.0
p = int(a[a.index("--prompt-len") + 1])
print("| measurement | tokens | best s | tokens/s | cpu s | tokens/cpu-s |")
print(f"| prefill (prime, {p} tokens) | {p} | 1.0 | {100.0 * t + bump:.1f} | 1.0 | 1.0 |")
print(f"| decode B=1 (plain generate's step: decode_step_batch at B=1, 32 steps) | 32 | 1.0 | {40.0 * t + bump:.1f} | 1.0 | 1.0 |")
print(f"| decode B=8 (decode_step_batch, 32 steps) | 256 | 1.0 | {90.0 * t:.1f} | 1.0 | 1.0 |")
'''

CPU_LLAMA_BENCH = r'''
import json, os, sys
a = sys.argv
t = int(a[a.index("-t") + 1])
assert len(os.sched_getaffinity(0)) == t
p, n = int(a[a.index("-p") + 1]), int(a[a.index("-n") + 1])
print(json.dumps([{"n_prompt": p, "n_gen": 0, "avg_ts": 200.0 * t, "samples_ts": [200.0 * t]},
                  {"n_prompt": 0, "n_gen": n, "avg_ts": 50.0 * t, "samples_ts": [50.0 * t]}]))
'''


def test_cpu_engines_alternate_on_the_same_pinned_cores_and_the_best_round_is_kept(tmp_path):
    src, _, env = setup(tmp_path)
    engine = executable(tmp_path / "memra-engine-cpu", CPU_ENGINE)
    env = dict(env, FAKE_LLAMA_BENCH=str(executable(tmp_path / "clb", CPU_LLAMA_BENCH)),
               FAKE_COUNT=str(tmp_path / "count"))
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("pinning 2 threads needs 2 CPUs")
    cmd = [sys.executable, str(CPU_SCRIPT), str(src), "--engine", str(engine), "--logs",
           str(tmp_path / "logs")]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rows = {tuple(c.strip() for c in line.split("|")[1:3]):
            [c.strip() for c in line.split("|")[3:6]]
            for line in out.stdout.splitlines() if line.startswith("| ") and "|---" not in line}
    # Three rounds of (2 threads, 1 thread): memra's third call (round 2, 2 threads) was
    # the best of its 2-thread rounds.
    assert rows[("2", "prefill 128")] == ["210.0", "400.0", "0.53×"]
    assert rows[("2", "decode B=1")] == ["90.0", "100.0", "0.90×"]
    assert rows[("2", "decode B=8")] == ["180.0", "—", "—"]
    assert rows[("1", "decode B=1")] == ["40.0", "50.0", "0.80×"]
    assert int((tmp_path / "count").read_text()) == 6
    # Once built, the source may be left out: the cached build's is used.
    out = subprocess.run(cmd[:2] + cmd[3:] + ["--rounds", "1"], env=env, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    # Bad input is named.
    out = subprocess.run(cmd + ["--threads", "0"], env=env, capture_output=True, text=True)
    assert out.returncode == 2 and "--threads 0" in out.stderr
