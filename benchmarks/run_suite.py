"""Run the whole benchmark suite and print one combined Markdown report.

Every benchmark behind the project's claims (``../shared/BENCHMARK.md``)
runs as a subprocess of the same Python interpreter, writes its JSON (and
its printed output, ``<step>.log``) into the output folder, and the report
is then built from those JSON files alone:

- ``table1-batch``, ``table1-stochastic``, ``table1-pseudo``,
  ``table1-pseudo-batch``: ``bench_table1.py`` in each inference mode
  (batch L-BFGS; SAGA; SAGA on the piecewise pseudo-likelihood; L-BFGS on
  the pseudo-likelihood), ``ess``: ``bench_ess.py`` (GPstruct's fixed
  hyperparameters), ``ess-learned``: the same at the hyperparameters a
  batch fit learns (``--learned-hyperparameters``). Section 1 (Table 1):
  error beside the CRF and LR of the same runs and the paper's rows,
  calibration, fit time and GP / CRF time.
- ``section2``: ``bench_section2.py``, BENCHMARK.md section 2.
- ``scale``: ``bench_scale.py``; ``chain``: ``bench_chain.py``;
  ``stacked``: ``bench_stacked.py``; ``block-cache``:
  ``bench_block_cache.py``; ``dask``: ``bench_dask.py``.

Each step's command line is printed before it runs. A step that fails
(non-zero exit status) is reported, the others still run, and the suite's
exit status is then 1. The report goes to stdout and ``<out>/report.md``;
``<out>/suite.json`` records every step's command, exit status and wall
time.

Examples
--------
The whole suite (a long run: see benchmarks/README.md)::

    OPENBLAS_NUM_THREADS=1 python benchmarks/run_suite.py

Smoke run of every step (a few minutes)::

    OPENBLAS_NUM_THREADS=1 python benchmarks/run_suite.py --quick

Two steps again, then the report from every JSON in the folder::

    python benchmarks/run_suite.py --only table1-batch ess
    python benchmarks/run_suite.py --report-only
"""

import argparse
import datetime
import functools
import importlib
import os
import shlex
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from _common import (
    DATASETS,
    MEASURED_TABLE1,
    PAPER_TABLE1,
    PEERS,
    PREDICT_MIN_TIME,
    PREDICTION_HEADER,
    PROBE_BASENP,
    QUOTED_SECTION2,
    difference_rows,
    format_mean_std,
    markdown_table,
    paper_gp_row,
    prediction_rows,
    read_json,
    write_json,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_OUT = HERE / "results" / "suite"
#: Lines of a failed step's log shown in the report.
LOG_TAIL = 8
SEED = ("--random-state", "0")
#: The stochastic protocol of Table 1, chosen on the dev splits (user guide,
#: "Choosing the optimiser"): mini-batches of 2 sequences, at most 60 epochs,
#: stop after 15 epochs that do not beat the best one by tol.
STOCHASTIC = ("--optimizer", "stochastic", "--batch-size", "2", "--max-iter", "60",
              "--tol", "1e-3", "--n-iter-no-change", "15")


@dataclass(frozen=True)
class Step:
    """One benchmark run: ``script args [--quick] --out <out>/<name>.json``."""

    name: str
    script: str
    args: tuple
    title: str
    takes_data: bool = False


STEPS = (
    Step("table1-batch", "bench_table1.py", SEED,
         "batch (L-BFGS), exact chain likelihood", True),
    Step("table1-stochastic", "bench_table1.py", STOCHASTIC + SEED,
         "stochastic (SAGA), exact chain likelihood", True),
    Step("table1-pseudo", "bench_table1.py",
         STOCHASTIC + ("--likelihood", "pseudo") + SEED,
         "stochastic (SAGA), pseudo-likelihood", True),
    Step("table1-pseudo-batch", "bench_table1.py",
         ("--likelihood", "pseudo") + SEED,
         "batch (L-BFGS), pseudo-likelihood", True),
    Step("ess", "bench_ess.py", SEED, "elliptical slice sampling (GPstruct)", True),
    Step("ess-learned", "bench_ess.py", ("--learned-hyperparameters",) + SEED,
         "elliptical slice sampling, hyperparameters learned by the ELBO", True),
    Step("section2", "bench_section2.py", SEED,
         "basenp, 500 training sequences (BENCHMARK.md section 2)", True),
    Step("scale", "bench_scale.py", (), "scaling in tokens and n_jobs"),
    Step("scale-points", "bench_scale.py",
         ("--kernel", "rbf", "--n-inducing", "500", "--no-lbfgs", "--no-crf"),
         "SAGA memory with 500 inducing points (RBF kernel)"),
    Step("chain", "bench_chain.py", (), "chain kernel throughput"),
    Step("stacked", "bench_stacked.py", (),
         "stacked potentials against sparse products", True),
    Step("block-cache", "bench_block_cache.py", (),
         "fits with the block cache against fits without it", True),
    Step("dask", "bench_dask.py", (), "dask beside loky"),
)
STEP_NAMES = tuple(s.name for s in STEPS)
#: The steps of section 1 (Table 1), one per inference mode.
TABLE1_STEPS = tuple(
    s for s in STEPS
    if s.script in ("bench_table1.py", "bench_ess.py")
)


# ---------------------------------------------------------------------- #
# running
def step_command(step, out_dir, quick, data):
    json_path = out_dir / f"{step.name}.json"
    cmd = [sys.executable, _shown(HERE / step.script), *step.args]
    if data is not None and step.takes_data:
        cmd += ["--data", data]
    if quick:
        cmd.append("--quick")
    return cmd + ["--out", _shown(json_path)]


def _shown(path):
    """A path relative to the repository root (the steps' cwd) if inside it."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def run_step(step, out_dir, quick, data, quiet):
    """Run one step; its output is echoed (unless quiet) and kept in a log."""
    cmd = step_command(step, out_dir, quick, data)
    json_path = out_dir / f"{step.name}.json"
    log_path = out_dir / f"{step.name}.log"
    if json_path.exists():  # never report a previous run's results as this one's
        json_path.unlink()
    env = dict(os.environ)
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        env.setdefault(name, "1")
    print(f"\n=== {step.name}: {step.title}", flush=True)
    print(f"$ {shlex.join(cmd)}", flush=True)
    started = datetime.datetime.now().isoformat(timespec="seconds")
    start = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(f"$ {shlex.join(cmd)}\n")
        try:
            proc = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, errors="replace",
            )
        except OSError as exc:
            log.write(f"could not start: {exc}\n")
            returncode = 127
        else:
            with proc:
                for line in proc.stdout:
                    log.write(line)
                    if not quiet:
                        sys.stdout.write(line)
                        sys.stdout.flush()
            returncode = proc.returncode
    seconds = time.perf_counter() - start
    status = "ok" if returncode == 0 else f"FAILED (exit status {returncode})"
    print(f"=== {step.name}: {status} in {seconds:.0f} s; log {_shown(log_path)}",
          flush=True)
    return {
        "command": shlex.join(cmd),
        "returncode": returncode,
        "seconds": seconds,
        "started": started,
        "quick": quick,
        "log": _shown(log_path),
        "json": _shown(json_path),
    }


# ---------------------------------------------------------------------- #
# report: helpers
def _folds_label(folds):
    return ", ".join(str(f["fold"]) for f in folds)


def _gp(fold):
    """The GP's numbers of a fold: bench_table1 nests them, bench_ess does not."""
    return fold.get("gp", fold)


def _values(folds, *keys):
    out = []
    for fold in folds:
        value = fold
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            out.append(value)
    return out


def _time_ratios(folds, peer):
    """GP fit time / the ``peer`` CRF's selection + refit (``"crf"`` or
    ``"crf_wide"``), per fold that has both times in its JSON."""
    ratios = []
    for fold in folds:
        gp_time = _gp(fold).get("fit_time")
        crf_time = (fold.get(peer) or {}).get("total_time")
        if gp_time is not None and crf_time:
            ratios.append(gp_time / crf_time)
    return ratios


def _calibration_or_failed(result):
    """A model's calibration figures in a fold, NaN (a failed value) where
    the model failed."""
    return result.get("calibration", {"nll": float("nan"), "ece": float("nan")})


def _ms(values, digits=2, unit=""):
    return format_mean_std(values, digits=digits, unit=unit) if values else "-"


def _paper_row(step, payload):
    if step.script == "bench_ess.py":
        return paper_gp_row(inference="ess")
    options = payload.get("gp_options", {})
    return paper_gp_row(options.get("optimizer"), options.get("likelihood"))


def _section(title, body):
    return f"## {title}\n\n{body.strip()}\n"


def _missing(name, suite):
    """Why the step ``name`` has no results: not run, failed, or unreadable."""
    record = suite.get("steps", {}).get(name)
    if record is None:
        return f"`{name}`: not run (no {name}.json in the folder)."
    if record["returncode"] != 0:
        text = (f"`{name}`: FAILED (exit status {record['returncode']}); "
                f"see `{record['log']}`.")
        try:
            tail = (REPO / record["log"]).read_text(encoding="utf-8").splitlines()
        except OSError:
            return text
        return text + "\n\n```\n" + "\n".join(tail[-LOG_TAIL:]) + "\n```"
    return f"`{name}`: ran, but its JSON is missing or unreadable."


# ---------------------------------------------------------------------- #
# report: the sections
def steps_section(suite, results):
    rows = []
    for step in STEPS:
        record = suite.get("steps", {}).get(step.name)
        payload = results.get(step.name)
        if record is None and payload is None:
            continue
        if record is None:
            rows.append([step.name, f"`{payload.get('command', '?')}`", "?", "?",
                         "yes" if payload.get("quick") else "no"])
            continue
        status = "0" if record["returncode"] == 0 else (
            f"**{record['returncode']} (FAILED)**")
        if payload is not None and payload.get("command") not in (
            None, record["command"]
        ):
            # The JSON was written by another command than the recorded run.
            rows.append([step.name, f"`{payload['command']}` (the JSON's; the "
                         f"suite's record: `{record['command']}`)", "?", "?",
                         "yes" if payload.get("quick") else "no"])
            continue
        rows.append([step.name, f"`{record['command']}`", status,
                     f"{record['seconds']:.0f} s",
                     "yes" if record.get("quick") else "no"])
    if not rows:
        return _section("Steps", "No step has run in this folder yet.")
    table = markdown_table(
        ["step", "command", "exit status", "wall time", "quick"], rows)
    records = suite.get("steps", {}).values()
    if records:
        total = sum(r["seconds"] for r in records)
        table += f"\n\nTotal wall time of the recorded steps: {total:.0f} s."
    return _section("Steps", table)


def table1_section(suite, results):
    runs = [(s, results[s.name]) for s in TABLE1_STEPS if s.name in results]
    notes = [_missing(s.name, suite) for s in TABLE1_STEPS if s.name not in results]
    parts = []
    if notes:
        parts.append("\n".join(f"- {n}" for n in notes))
    if not runs:
        return _section("1. Table 1 (BENCHMARK.md section 1)", "\n\n".join(parts))
    names = [n for n in DATASETS if any(n in p["results"] for _, p in runs)]

    err_rows, cal_rows, time_rows, diff_rows, predict_rows = [], [], [], [], []
    for name in names:
        peers = {label: {} for _, label in PEERS}
        for step, payload in runs:
            folds = payload["results"].get(name)
            if not folds:
                continue
            row = _paper_row(step, payload)
            gps = [_gp(f) for f in folds]
            err_rows.append([
                name, step.title, _folds_label(folds),
                _ms([g["error"] for g in gps]),
                _ms(_values(folds, "crf", "error")),
                _ms(_values(folds, "crf_wide", "error")),
                _ms(_values(folds, "logreg", "error")),
                f"{row}: {PAPER_TABLE1[name][row]}" if row else "no paper row",
            ])
            cal = [_calibration_or_failed(g) for g in gps
                   if "calibration" in g or "failure" in g]
            cal_rows.append([
                name, f"GP, {step.title}",
                _ms([c["nll"] for c in cal], 3), _ms([c["ece"] for c in cal], 4),
            ])
            diff_rows += [
                [row[0], step.title, *row[1:]]
                for row in difference_rows({name: folds}, lambda f: _gp(f).get("error"))
            ]
            for key, label in PEERS:
                pc = _values(folds, key, "calibration")
                if pc:
                    peers[label][step.name] = (
                        _ms([c["nll"] for c in pc], 3), _ms([c["ece"] for c in pc], 4))
            if step.script == "bench_ess.py":
                n_iter = str(payload.get("options", {}).get("n_iter", "-"))
                converged = "-"
            else:
                n_iter = _ms([g.get("n_iter", float("nan")) for g in gps
                              if "n_iter" in g or "failure" in g], 0)
                conv = [g["converged"] for g in gps if "converged" in g]
                n_failed = sum("failure" in g for g in gps)
                converged = (
                    f"{sum(conv)}/{len(conv) + n_failed}"
                    + (f" [{n_failed} failed]" if n_failed else "")
                    if conv or n_failed else "-"
                )
            predict_rows += [
                [row[0], step.title, *row[1:]]
                for row in prediction_rows({name: folds})
            ]
            time_rows.append([
                name, step.title, _folds_label(folds),
                _ms([g["fit_time"] for g in gps], unit=" s"), n_iter, converged,
                _ms(_values(folds, "crf", "total_time"), unit=" s"),
                _ms(_time_ratios(folds, "crf"), 1, "x"),
                _ms(_time_ratios(folds, "crf_wide"), 1, "x"),
            ])
        for label, by_step in peers.items():
            if len(by_step) > 1 and len(set(by_step.values())) == 1:
                nll, ece = next(iter(by_step.values()))
                cal_rows.append([name, f"{label} (same in every run)", nll, ece])
            else:
                for step_name, (nll, ece) in by_step.items():
                    cal_rows.append([name, f"{label} ({step_name} run)", nll, ece])

    parts.append(
        "### Token error % (mean (std over folds, ddof=1))\n\n" + markdown_table(
            ["data set", "GP mode", "folds", "GP error %", "CRF error % (same run)",
             "CRF {1e-4..10} error % (same run)", "LR error % (same run)",
             "paper (quoted)"],
            err_rows,
        ))
    parts.append(
        "CRF: sklearn-crfsuite, L-BFGS, c1=0, c2 by 3-fold inner CV over "
        "{0.01, 0.1, 1, 10} (BENCHMARK.md section 3); CRF {1e-4..10}: the same "
        "over {1e-4, 1e-3, 0.01, 0.1, 1, 10}, the grid of BENCHMARK.md's "
        "measured CRF row; LR: per-token LogisticRegression, C by the same "
        "CV; all on the GP's features, in the same process.")
    if diff_rows:
        parts.append(
            "### Paired differences, GP minus peer (error points, mean "
            "(standard error) over the same folds)\n\n" + markdown_table(
                ["data set", "GP mode", "peer", "GP - peer",
                 "folds where the GP is lower"],
                diff_rows,
            ))
    quoted = [[n, PAPER_TABLE1[n]["CRF"], PAPER_TABLE1[n]["SVM-struct"],
               MEASURED_TABLE1[n]["CRF"], MEASURED_TABLE1[n]["SSVM"],
               MEASURED_TABLE1[n]["LR"], MEASURED_TABLE1[n]["CRF time"]]
              for n in names]
    parts.append("Quoted from BENCHMARK.md, not measured here:\n\n" + markdown_table(
        ["data set", "paper CRF", "paper SVM-struct", "measured CRF",
         "measured SSVM", "measured LR", "measured CRF fit + selection"],
        quoted,
    ) + (f"\n\nFloor (NumPy weight-space probe, basenp): {PROBE_BASENP}."
         if "basenp" in names else ""))
    parts.append("### Calibration of the per-token marginals (mean (std over "
                 "folds))\n\n" + markdown_table(
                     ["data set", "model", "NLL of the true label (nats/token)",
                      "ECE (top label)"],
                     cal_rows,
                 ))
    parts.append("### Fit time per fold (mean (std)) and GP / CRF time\n\n"
                 + markdown_table(
                     ["data set", "GP mode", "folds", "GP fit", "iterations",
                      "converged", "CRF selection + refit", "GP fit / CRF time",
                      "GP fit / CRF {1e-4..10} time"],
                     time_rows,
                 ))
    parts.append(
        "GP fit / CRF time: GP fit time / (CRF c2 selection + refit), per fold "
        "(same process), then averaged; the protocol's figure (c2 over "
        "BENCHMARK.md section 3's grid). GP fit / CRF {1e-4..10} time: the "
        "same against the CRF whose c2 is chosen over the wider grid of "
        "BENCHMARK.md's measured CRF row (six values instead of four). "
        "Iterations: L-BFGS iterations or SAGA epochs; ESS: sampler "
        "iterations. Converged: folds whose fit stopped "
        "on its tolerance before max_iter.")
    if predict_rows:
        parts.append(
            "### Prediction time on the test fold (mean (std over folds))\n\n"
            + markdown_table(
                ["data set", "GP mode", *PREDICTION_HEADER], predict_rows
            ))
        parts.append(
            "Mean seconds per call over repeated calls of at least "
            f"{PREDICT_MIN_TIME:g} s, the GP's and the protocol CRF's, each "
            "from its own input built beforehand (CSR template features; "
            "crfsuite's item sequences) to labels or marginal arrays; GP / "
            "CRF per fold, then averaged. Last two columns: building those "
            "inputs (template features from the test tokens; item sequences "
            "from crfsuite's feature dicts).")
    return _section("1. Table 1 (BENCHMARK.md section 1)", "\n\n".join(parts))


def section2_section(suite, results):
    title = "2. basenp at a larger scale (BENCHMARK.md section 2)"
    payload = results.get("section2")
    if payload is None:
        return _section(title, _missing("section2", suite))
    import bench_section2

    reps = payload["results"]
    epochs = payload.get("stochastic_epochs") or [1]
    err_cols, time_cols = bench_section2.columns(reps, epochs)
    n_tokens = _ms([r["n_train_tokens"] for r in reps], 0)
    parts = [
        f"{len(reps)} repetition(s), {payload.get('n_train')} training sequences "
        f"({n_tokens} tokens); L-BFGS max_iter "
        f"{payload.get('lbfgs_max_iter') or 'default'}, SAGA epoch budgets "
        f"{epochs}.",
        "### Token error %\n\n" + bench_section2.table(reps, err_cols, ""),
        "### Fit time (time to reach the error)\n\n"
        + bench_section2.table(reps, time_cols, " s"),
        "'GP SAGA to final error' is the fit time of the shortest epoch budget "
        "whose test error is no worse than the longest budget's; GP L-BFGS: its "
        "fit time.",
        "### Every model: error, time and calibration\n\n"
        + bench_section2.summary_table(reps, epochs),
    ]
    if any("gp_stochastic" in r for r in reps):
        nested = all(r["gp_stochastic"]["nested"] for r in reps
                     if "gp_stochastic" in r)
        parts.append("### GP SAGA: error against epochs\n\n"
                     + bench_section2.curve_table(reps)
                     + "\n\nShorter budgets replay the longer fits' first epochs: "
                     + ("yes." if nested else "NO."))
    parts.append("Quoted from BENCHMARK.md section 2, not measured here:\n\n"
                 + markdown_table(["result", "error %"], QUOTED_SECTION2))
    return _section(title, "\n\n".join(parts))


def scale_section(suite, results, name="scale",
                  title="3. Scaling in training tokens and n_jobs (bench_scale.py)"):
    payload = results.get(name)
    if payload is None:
        return _section(title, _missing(name, suite))
    import bench_scale

    rows = [(m["config"], m["result"]) for m in payload["measurements"]]
    sizes = sorted({c["size"] for c, _ in rows})
    jobs = list(dict.fromkeys(
        c["n_jobs"] for c, _ in rows if c["size"] == sizes[-1] and c["kind"] != "crf"
    )) or [1]
    parts = [
        "### Measurements (one fresh process each)\n\n"
        + bench_scale.measurements_table(rows),
        f"### Ratios (n_jobs={jobs[0]}; 'x' columns: this size over the previous "
        "one)\n\n" + bench_scale.ratios_table(rows, sizes, jobs[0]),
    ]
    if len(jobs) > 1:
        parts.append(f"### n_jobs at {sizes[-1]} tokens\n\n"
                     + bench_scale.jobs_table(rows, sizes[-1], jobs))
    return _section(title, "\n\n".join(parts))


def scale_points_section(suite, results):
    return scale_section(
        suite, results, "scale-points",
        "3b. SAGA with 500 inducing points, RBF kernel (bench_scale.py)",
    )


def chain_section(suite, results):
    title = "4. Chain kernels against vectorised NumPy (bench_chain.py)"
    payload = results.get("chain")
    if payload is None:
        return _section(title, _missing("chain", suite))
    import bench_chain

    return _section(title, "\n\n".join([
        "Scaled recursion (unary and pairwise ~ N(0, 1)), cells = samples x "
        "tokens x V^2 per second, one thread:\n\n"
        + bench_chain.markdown(payload["scaled"]),
        "Log-space fallback (pairwise range > 300):\n\n"
        + bench_chain.markdown(payload["fallback"]),
        "NumPy: the same recursions vectorised over samples and sequences (a "
        "Python loop over positions), checked to give the kernels' results; "
        "Viterbi has no samples axis (n/a for S=32).",
    ]))


def _rows_section(suite, results, *, name, title, module, caption):
    """A step whose JSON holds ``rows`` for its script's ``markdown``, then
    ``caption(payload)``."""
    payload = results.get(name)
    if payload is None:
        return _section(title, _missing(name, suite))
    markdown = importlib.import_module(module).markdown
    rows = [tuple(row.values()) for row in payload["rows"]]
    return _section(title, markdown(rows) + "\n\n" + caption(payload))


stacked_section = functools.partial(
    _rows_section, name="stacked", module="bench_stacked",
    title="4b. Stacked potentials against sparse products (bench_stacked.py)",
    caption=lambda payload: (
        "One evaluation's work on the unary potentials of a fit's first "
        "chunk (8 samples): the compiled loops against scipy's sparse "
        "products (tests/_stacked_reference.py), one thread; the ratio is "
        "the median of 11 alternating runs."
    ),
)
block_cache_section = functools.partial(
    _rows_section, name="block-cache", module="bench_block_cache",
    title="4c. The block cache (bench_block_cache.py)",
    caption=lambda payload: (
        f"Batch fits of Table 1's fold 0, each in a fresh process, "
        f"{payload['rounds']} alternating rounds: NumPy's large temporaries "
        "through skgpstruct._block_cache, and with reuse_blocks replaced by "
        "a no-op; both give the same model."
    ),
)


def dask_section(suite, results):
    title = "5. dask beside loky (bench_dask.py)"
    payload = results.get("dask")
    if payload is None:
        return _section(title, _missing("dask", suite))
    import bench_dask

    return _section(title, bench_dask.report(payload))


SECTIONS = (steps_section, table1_section, section2_section, scale_section,
            scale_points_section,
            chain_section, stacked_section, block_cache_section, dask_section)


def _environment_lines(envs):
    """The report's environment: one line when every step's JSON records
    the same, else the first step's and, per other step, what differs (a
    folder may hold runs of several commits or machines)."""
    if not envs:
        return []
    (first_name, first), *others = envs.items()
    differ = []
    for name, env in others:
        changed = {k: env.get(k) for k in {*first, *env} if env.get(k) != first.get(k)}
        if changed:
            differ += ["", f"Environment of {name}, where it differs: "
                       + ", ".join(f"{k} {changed[k]}" for k in sorted(changed))
                       + "."]
    return ["", "Environment" + (f" ({first_name})" if differ else "") + ": "
            + ", ".join(f"{k} {v}" for k, v in first.items()) + ".", *differ]


def build_report(out_dir):
    """The Markdown report of every JSON in ``out_dir``."""
    suite = read_json(out_dir / "suite.json") or {}
    results = {}
    for step in STEPS:
        payload = read_json(out_dir / f"{step.name}.json")
        if payload is not None:
            results[step.name] = payload
    envs = {name: p["environment"] for name, p in results.items()
            if "environment" in p}
    quick = sorted(name for name, p in results.items() if p.get("quick"))
    head = [
        "# skgpstruct benchmark suite",
        "",
        f"Report built {datetime.datetime.now().isoformat(timespec='seconds')} "
        f"from `{_shown(out_dir)}`.",
    ]
    head += _environment_lines(envs)
    if quick:
        head += ["", "**Smoke run** (`--quick`: one fold, few iterations, small "
                 f"sizes) for: {', '.join(quick)}. Its figures check that the "
                 "suite runs; they are not the benchmark's results."]
    head += ["", "Every speed figure is a ratio against a peer measured in the "
             "same run; absolute times on shared machines are noisy."]
    body = []
    for section in SECTIONS:
        try:
            body.append(section(suite, results))
        except Exception as exc:  # noqa: BLE001 - one bad section, not the report
            body.append(f"## {section.__name__}\n\nCould not build this section: "
                        f"{type(exc).__name__}: {exc}\n\n```\n"
                        f"{traceback.format_exc()}```\n")
    return "\n".join(head) + "\n\n" + "\n".join(body)


# ---------------------------------------------------------------------- #
# command line
def build_parser():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="steps: " + ", ".join(STEP_NAMES),
    )
    parser.add_argument(
        "--out", default=str(DEFAULT_OUT), metavar="DIR",
        help="folder of the JSON files, logs and report.md (default: "
        "benchmarks/results/suite)",
    )
    parser.add_argument(
        "--only", nargs="+", choices=STEP_NAMES, metavar="NAME",
        help="run these steps only (the report still covers every JSON in "
        "the folder)",
    )
    parser.add_argument(
        "--quick", action="store_true",
        help="pass --quick to every step: a smoke run of a few minutes",
    )
    parser.add_argument(
        "--report-only", action="store_true",
        help="run nothing: rebuild the report from the JSON files in --out",
    )
    parser.add_argument(
        "--data", metavar="DIR",
        help="data directory passed to the steps that read the CRF++ sets",
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true",
        help="do not echo the steps' output (it is still in <out>/<step>.log)",
    )
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    suite_path = out_dir / "suite.json"
    suite = read_json(suite_path) or {"steps": {}}
    selected = [s for s in STEPS if not args.only or s.name in args.only]

    failed = []
    if args.report_only:
        failed = [s.name for s in selected
                  if suite["steps"].get(s.name, {}).get("returncode", 0) != 0]
    else:
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
            if name not in os.environ:
                print(f"{name} is not set: the steps run with {name}=1")
        print(f"running {len(selected)} step(s) into {_shown(out_dir)}: "
              + ", ".join(s.name for s in selected), flush=True)
        start = time.perf_counter()
        for step in selected:
            record = run_step(step, out_dir, args.quick, args.data, args.quiet)
            suite["steps"][step.name] = record
            if record["returncode"] != 0:
                failed.append(step.name)
            # After every step, so that an interrupted suite keeps its record.
            write_json(suite_path, suite)
        print(f"\nsuite: {len(selected)} step(s) in "
              f"{time.perf_counter() - start:.0f} s", flush=True)
        print("commands run:")
        for step in selected:
            print(f"  {suite['steps'][step.name]['command']}")

    report = build_report(out_dir)
    print()
    print(report)
    report_path = out_dir / "report.md"
    report_path.write_text(report, encoding="utf-8")
    print(f"report written to {_shown(report_path)}")
    if failed:
        print(f"FAILED steps: {', '.join(failed)} (see their logs in "
              f"{_shown(out_dir)})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
