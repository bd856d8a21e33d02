"""What scripts/bench-vs-llamacpp (CPU) and scripts/bench-vs-llamacpp-cuda share: running a
measured command with its log, trimming and building a llama.cpp tree the user gives,
synthesizing checkpoints with memra-engine, and reading llama-bench's JSON."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


class Failed(Exception):
    """A build or a measurement failed; the message names its log."""


def usage(tool, message):
    print(f"{tool}: {message}", file=sys.stderr)
    sys.exit(2)


def run(cmd, log, env=None, cpus=None):
    """Runs `cmd` in `env` (pinned to the CPUs `cpus` when given); its stdout and stderr go
    to `log` (stderr after stdout); returns stdout alone, so nothing a tool logs can land
    inside what is parsed. Raises Failed."""
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    with open(log, "w") as f:
        f.write("$ " + " ".join(str(c) for c in cmd) + "\n")
        f.flush()
        try:
            p = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True,
                               preexec_fn=pin)
        except (OSError, subprocess.SubprocessError) as e:
            raise Failed(f"cannot run {cmd[0]}: {e}")
        f.write(p.stdout)
        f.write("\n--- stderr ---\n" + p.stderr)
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
        raise Failed(f"`{' '.join(str(c) for c in cmd[:3])} …` exited {p.returncode}; "
                     f"its log: {log}\n{tail}")
    return p.stdout


def check_source(tool, source):
    needed = ["CMakeLists.txt", "ggml", "tools/llama-bench", "tools/batched-bench"]
    missing = [n for n in needed if not (source / n).exists()]
    if missing:
        usage(tool, f"{source} is not a llama.cpp source folder of 2025 or later (it has no "
                    f"{', '.join(missing)}); give the folder holding them, e.g. the "
                    "vendor/llama.cpp of the llama-cpp-python source package")


KEEP_TOP = ["CMakeLists.txt", "cmake", "common", "ggml", "include", "src", "vendor",
            "tools", "licenses", "LICENSE", "CMakePresets.json"]


def trim(tool, source, dest):
    """Copies what llama-bench and llama-batched-bench need of a llama.cpp tree into `dest`:
    the ggml core with its CPU and CUDA backends, src/, include/, common/, vendor/, the two
    tools (about 20 MB, 3 MB as a .tar.gz)."""
    source, dest = Path(source), Path(dest)
    check_source(tool, source)
    if dest.exists():
        usage(tool, f"{dest} exists; give a new folder to trim into")
    dest.mkdir(parents=True)
    for name in KEEP_TOP:
        s = source / name
        if s.is_dir():
            shutil.copytree(s, dest / name, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        elif s.is_file():
            shutil.copy2(s, dest / name)
    for t in (dest / "tools").iterdir():
        if t.is_dir() and t.name not in ("llama-bench", "batched-bench"):
            shutil.rmtree(t)
    (dest / "tools" / "CMakeLists.txt").write_text(
        "add_subdirectory(batched-bench)\nadd_subdirectory(llama-bench)\n")
    for b in (dest / "ggml" / "src").iterdir():
        if b.is_dir() and b.name.startswith("ggml-") and b.name not in ("ggml-cpu", "ggml-cuda"):
            shutil.rmtree(b)
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"{dest}: {size / 1e6:.1f} MB")


def cache_dir():
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "memra"


def build_dir_for(kind, source, flags):
    key = hashlib.sha256(f"{source}|{' '.join(flags)}".encode()).hexdigest()[:12]
    return cache_dir() / f"llama.cpp-{kind}" / key


def build(source, build_dir, flags, targets, jobs, logs):
    """Configures (again whenever the configuration asked for differs from the last one) and
    builds `targets`; returns their paths by name."""
    build_dir.mkdir(parents=True, exist_ok=True)
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = ["cmake", "-S", str(source), "-B", str(build_dir), *gen,
                 "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=OFF",
                 "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                 "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
                 "-DGGML_NATIVE=ON", *flags]
    stamp = build_dir / "memra-configure.txt"
    if not stamp.is_file() or stamp.read_text() != "\n".join(configure):
        run(configure, logs / "llama.cpp-cmake.log")
        stamp.write_text("\n".join(configure))
    run(["cmake", "--build", build_dir, "--target", *targets, "-j", str(jobs)],
        logs / "llama.cpp-build.log")
    found = {}
    for t in targets:
        hits = [p for p in (build_dir / "bin", build_dir) if (p / t).is_file()]
        if not hits:
            raise Failed(f"the build made no {t}; see {logs / 'llama.cpp-build.log'}")
        found[t] = hits[0] / t
    return found


def find_engine(tool, given):
    candidates = [Path(given)] if given else [
        ROOT / "target/release/memra-engine", ROOT / ".device/bin/memra-engine"]
    engine = next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)
    if engine is None:
        usage(tool, f"no memra-engine at {', '.join(map(str, candidates))}; build it with "
                    "`cargo build --release --locked --bins` or pass --engine PATH")
    return engine


def synth(engine, preset, quant, models, logs, env=None):
    models.mkdir(parents=True, exist_ok=True)
    path = models / f"{preset}-{quant}.gguf"
    if not path.is_file():
        part = path.with_name(path.name + ".part")
        run([engine, "synth", "--preset", preset, "--quant", quant, "--out", part],
            logs / f"synth-{preset}.log", env=env)
        part.rename(path)
    return path


def table_rows(text, first_column):
    """The columns of the markdown table rows of `text` whose first column is
    `first_column` (stripped)."""
    out = []
    for line in text.splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.strip().startswith("|") and cols and cols[0] == first_column:
            out.append(cols)
    return out


def llama_bench_json(out, log):
    try:
        return json.loads(out)
    except json.JSONDecodeError as e:
        raise Failed(f"llama-bench's JSON did not parse ({e}); see {log}")


def llama_bench_best(rows, prompt, gen, depth, log):
    """tokens/s of llama-bench's row for pp`prompt` tg`gen` at depth `depth`: its best
    sample, as memra's rows are its best repetition."""
    for r in rows:
        if r.get("n_prompt") == prompt and r.get("n_gen") == gen and r.get("n_depth", 0) == depth:
            return float(max(r.get("samples_ts") or [r["avg_ts"]]))
    raise Failed(f"llama-bench reported no row for pp{prompt} tg{gen} d{depth}; see {log}")


def clean_env(**set_):
    """This environment without memra's own settings (its doors at their defaults), plus
    `set_`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMRA_")}
    env.update({k: str(v) for k, v in set_.items()})
    return env
