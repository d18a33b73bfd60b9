#!/usr/bin/env python3
"""Runs every command of the ```sh blocks of README.md and docs/*.md, scaled down, in a scratch
directory, and checks their links and the repository paths they name.

  scripts/readme_test.py BUILD_DIR MPIRUN [MPIRUN_ARGS...]

Each block runs as one bash script (set -e) in a scratch directory whose build/, scripts/,
examples/, bench/ and sshsdp/ point at this checkout, in PAGES order (later blocks use what earlier ones
wrote; a docs page missing from PAGES fails). Every relative link [text](path) must name a file
that exists, and every `path/like/this.ext` in backticks a file of the repository (from its root,
sshsdp/ or the page's folder), so a page cannot point at code that was moved or deleted.
Scaling, so the whole README runs in a couple of minutes on 2 cores:
  * step counts (--steps, --save-every, --eval-every, --warmup, --eval-tokens, --decay-steps,
    the same keys in TOML, and step_<N> directory names) are divided by 50;
  * `sshsdp train` runs a 1-block, d=32 model of the named preset over 16 tokens
    (appended flags: sshsdp takes the last value of an option; a Hugging Face model keeps its
    shape, over 16 tokens); `sshsdp bench` likewise;
  * mpirun gets the test's launcher arguments (oversubscription, root);
  * the benchmark binaries get their smallest sizes; optional `[...]` arguments are dropped.
Blocks that cannot run here are reported, not passed: scripts/test.sh (it is CI itself), the
real-PyTorch peer (downloads PyTorch), and the GPU lines (gpu_check.sh, --backend cuda); the sbatch script is checked with bash -n and its
srun line's options are parsed. The README's data files (out/train.bin, out/val.bin) are
GPT-2-sized fixtures. Exit status: the number of failed blocks.
"""
import os
import re
import subprocess
import sys
import tempfile
import time

FACTOR = 50
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
STEP_FLAGS = ["steps", "save-every", "eval-every", "warmup", "eval-tokens", "decay-steps"]
TRAIN_FAST = "--layers 1 --d-model 32 --heads 2 --seq-len 16 --gemm-peak 10 --log-every 1"
# A Hugging Face model fixes its shape (--layers & co. are refused with it): its tiny test models.
TRAIN_FAST_HF = "--seq-len 16 --gemm-peak 10 --log-every 1"
BENCH_FAST = "--layers 1 --seq-len 16 --warmup 1 --steps 2"
NOT_RUN = {
    "scripts/test.sh": "the test command itself (CI runs it)",
    "bench/peers/run_fsdp2_peer.sh": "installs PyTorch into a virtual environment (CI has no "
                                     "budget for it; bench_test checks the peer's inputs)",
    "bench/eager_sweep.sh": "runs bench/peers/run_fsdp2_peer.sh (PyTorch) over a sweep",
    "scripts/gpu_check.sh": "needs a GPU machine (ctest's backend_test_cpu runs the same "
                            "checks on the CPU backend; the _cuda entry reports skipped here)",
    "--backend cuda": "needs a GPU machine (cli_emulated_cuda_test runs it on the CPU "
                      "emulation of CUDA)",
}


PAGES = ["README.md", "docs/models.md", "docs/training.md", "docs/precision.md", "docs/checkpoints.md",
         "docs/troubleshooting.md", "docs/tools.md", "docs/design.md", "docs/library.md",
         "docs/testing.md", "docs/performance.md", "docs/gpu.md"]
FILE_EXT = r"(?:h|cc|cu|cuh|sh|py|md|cmake|txt|toml|json)"


def link_errors(page):
    """Relative links to missing files and backticked repository paths that do not exist."""
    errors, here = [], os.path.dirname(os.path.join(REPO, page))
    text = open(os.path.join(REPO, page)).read()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not os.path.exists(os.path.join(here, target.split("#")[0])):
            errors.append(f"{page}: link to missing {target}")
    for path in re.findall(rf"`([\w.-]+(?:/[\w.-]+)+\.{FILE_EXT})`", text):
        roots = (REPO, os.path.join(REPO, "sshsdp"), here)
        if path.startswith(("out/", "build/", "../")) or any(
                os.path.exists(os.path.join(r, path)) for r in roots):
            continue
        errors.append(f"{page}: names missing file {path}")
    return errors


def blocks(readme):
    out, cur = [], None
    for line in open(readme):
        if cur is None and line.startswith("```sh"):
            cur = []
        elif cur is not None and line.startswith("```"):
            out.append("".join(cur))
            cur = None
        elif cur is not None:
            cur.append(line)
    return out


def scale(n, minimum):
    return str(max(minimum, int(n) // FACTOR))


def transform(text, mpirun, build):
    # Step counts, in flags, TOML keys and step directory names.
    for f in STEP_FLAGS:
        minimum = 0 if f == "warmup" else 1
        text = re.sub(rf"--{f}(=| )(\d+)", lambda m: f"--{f}{m.group(1)}{scale(m.group(2), minimum)}", text)
        text = re.sub(rf"^{f} = (\d+)$", lambda m: f"{f} = {scale(m.group(1), minimum)}", text,
                      flags=re.M)
    text = re.sub(r"step_(\d{8})", lambda m: f"step_{int(m.group(1)) // FACTOR:08d}", text)
    text = re.sub(r" \[[^\]]*\]", "", text)  # optional arguments
    lines = []
    for line in text.replace("\\\n", " ").split("\n"):
        code = line.split(" #")[0].rstrip() if not line.lstrip().startswith("#") else line
        if re.search(r"\bsshsdp (train)\b", code) and "--dump-config" not in code:
            hf = re.search(r"--(init-from-hf|model-config)\b", code)
            code += " " + (TRAIN_FAST_HF if hf else TRAIN_FAST)
        if re.search(r"\bsshsdp bench\b", code):
            code += " " + BENCH_FAST
        code = re.sub(r"\bmodels_gpt_bench small 4 15\b", "models_gpt_bench tiny 1 2", code)
        code = re.sub(r"\bmodels_layers_bench\b(.*)$", r"models_layers_bench 4096", code)
        code = re.sub(r"\bkernels_attention_bench\b(.*)$", r"kernels_attention_bench 1 64 2 16", code)
        code = re.sub(r"\bkernels_amx_gemm_bench\b(.*)$", r"kernels_amx_gemm_bench 64", code)
        code = re.sub(r"\bmx_bench\b", "mx_bench --d 32 --layers 1 --steps 2 --warmup 1", code)
        code = re.sub(r"\bupdate_bench\b", "update_bench --layers 1 --seq-len 16 --warmup 1", code)
        code = re.sub(r"\bcomm_bench\b(?!_)", "comm_bench --max-bytes 65536 --iters 2 --warmup 1",
                      code)
        code = re.sub(r"^bench/precision_ablation\.sh", "STEPS=3 RANKS=2 bench/precision_ablation.sh"
                      " --layers 1 --d-model 32 --heads 2 --seq-len 16 --gemm-peak 10", code)
        # run.sh works in its own checkout (cd to it): the real path, this build directory.
        code = re.sub(r"^scripts/run\.sh", f"BUILD_DIR={build} {REPO}/scripts/run.sh "
                      "--steps 2 " + TRAIN_FAST, code)
        code = re.sub(r"(^|\s)mpirun\b", lambda m: m.group(1) + mpirun, code)
        lines.append(code)
    return "\n".join(lines)


def main():
    if len(sys.argv) < 3 or sys.argv[1].startswith("-") or not os.path.isfile(
            os.path.join(sys.argv[1], "bin", "sshsdp")):
        sys.exit(__doc__.split("\n\n")[1] + "\n(BUILD_DIR: a build directory holding bin/sshsdp; "
                 "MPIRUN: the mpirun command, e.g. mpirun --oversubscribe)")
    build, mpirun = os.path.abspath(sys.argv[1]), " ".join(sys.argv[2:])
    fails = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("scripts", "bench", "examples", "sshsdp"):
            os.symlink(os.path.join(REPO, name), os.path.join(tmp, name))
        os.symlink(build, os.path.join(tmp, "build"))
        os.makedirs(os.path.join(tmp, "out"))
        subprocess.run([sys.executable, os.path.join(REPO, "sshsdp/cli/testing/make_gpt2_tokens.py"),
                        os.path.join(tmp, "out")], check=True)
        pages = sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(REPO, "docs"))
                       if f.endswith(".md"))
        for page in set(pages) - set(PAGES):
            print(f"FAIL     {page} is not in readme_test.py's PAGES (its blocks would not run)")
            fails += 1
        for err in (e for page in PAGES for e in link_errors(page)):
            print(f"FAIL     {err}")
            fails += 1
        numbered = [(page, b) for page in PAGES for b in blocks(os.path.join(REPO, page))]
        for i, (page, block) in enumerate(numbered, 1):
            first = next((l for l in block.split("\n") if l.strip() and not l.startswith("# ")), "")
            if block.startswith("#!"):  # a batch script: syntax, and its options parse
                script = os.path.join(tmp, f"block{i}.sbatch")
                open(script, "w").write(block)
                srun = [l for l in block.split("\n") if l.startswith("srun ")][0]
                code = (f"bash -n {script} && "
                        + srun.replace("srun --mpi=pmix ", "") + " --dump-config >/dev/null")
            else:
                code = transform(block, mpirun, build)
                for cmd, why in NOT_RUN.items():
                    if cmd in code:
                        print(f"not run  block {i}: {cmd}: {why}")
                        code = "\n".join(l for l in code.split("\n") if cmd not in l)
                if not any(l.strip() and not l.lstrip().startswith("#") for l in code.split("\n")):
                    continue
            t0 = time.time()
            r = subprocess.run(["bash", "-e", "-c", code], cwd=tmp, capture_output=True, text=True,
                               errors="replace", timeout=600)
            status = "ok  " if r.returncode == 0 else "FAIL"
            print(f"{status}     block {i} {page} ({time.time() - t0:.0f} s): {first[:80]}")
            if r.returncode != 0:
                fails += 1
                print("  script:\n" + "\n".join("  | " + l for l in code.split("\n")))
                print("  output:\n" + "\n".join("  | " + l for l in (r.stdout + r.stderr).split("\n")[-25:]))
    print(f"readme: {fails} failure(s)")
    sys.exit(fails)


if __name__ == "__main__":
    main()
