"""Evaluation records (one JSON object per file under ``RUN/eval/``: make_record_fields' keys plus
provenance {"eval", "run"}) and the leaderboard over them (a commit column; one-line warnings when
runs differ in code, versions or data)."""
from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path

from .. import config
from .. import provenance as provenance_lib
from ..io import shown_path, write_text_atomic
from .options import reference_data_set

# The MuToR paper's reported numbers: LlamaGen-B, ImageNet 256x256, ADM evaluator, 50K samples, cfg 2.0;
# its curves: step -> (fid, is) of each of PAPER_METHODS.
PAPER_METHODS = [("next-token", "paper"), ("MuToR-1D", "paper"), ("MuToR-2D", "paper, 256 reg."),
                 ("MuToR-2D", "paper, sparse 80 reg.")]
PAPER_SCORES = {100_000: [(7.71, 146.5), (7.01, 155.6), (6.57, 163.2), (6.87, 162.1)],
                200_000: [(6.83, 158.4), (6.43, 163.0), (5.65, 183.5), (5.89, 175.6)],
                360_000: [(6.18, 171.5), (5.79, 178.3), (5.09, 195.3), (5.03, 195.6)]}
PAPER_ROWS = [  # method, objective, step, fid, is: the curves of PAPER_SCORES, then single points
    *((method, objective, step, fid, is_) for step, scores in PAPER_SCORES.items()
      for (method, objective), (fid, is_) in zip(PAPER_METHODS, scores)),
    ("next-token", "paper", 500_000, 5.82, 175.8),
    ("MuToR-2D", "paper, sparse 80 reg., D=3", 360_000, 5.56, None),
    ("MuToR-2D", "paper, sparse 80 reg., D=5", 360_000, 5.53, None),
    ("LlamaGen-B release", "paper, 300 epochs", None, 5.46, 193.6),
]
PAPER_EVALUATOR = "ADM suite (TF Inception)"
PAPER_REFERENCE = "ImageNet 256 (ADM batch)"


class RecordError(ValueError):
    """A missing or unreadable record; the message is one line naming the file."""


def run_dir_from_meta(meta: dict) -> Path | None:
    """The run folder a sample file came from: meta["run_dir"], else the folder above the
    checkpoint's ``checkpoints/`` folder (RUN/checkpoints/step_X.pt). None if neither is known."""
    if meta.get("run_dir"):
        return Path(meta["run_dir"])
    ckpt = meta.get("checkpoint") or meta.get("ckpt")
    if ckpt and Path(ckpt).parent.name == "checkpoints":
        return Path(ckpt).parent.parent
    return None


def make_record(result, *, samples, reference, method: str | None = None, samples_path: str = "") -> dict:
    """A record from a metrics.Result and the two sources.ImageSource it compared."""
    meta = dict(samples.meta)
    config = meta.pop("config", None) or meta.pop("run_config", None) or {}
    objective = config.get("objective", {}) if isinstance(config, dict) else {}
    return make_record_fields(
        metrics=result.metrics, skipped=result.skipped, evaluator=result.evaluator, reference=reference.name,
        reference_detail={"n": reference.n, "stored_stats": reference.mu is not None}, n=samples.n,
        sampling=meta, samples=samples_path or samples.name, config=config, objective=objective, method=method,
        checkpoint=meta.get("checkpoint") or meta.get("ckpt"))


def make_record_fields(*, metrics: dict, evaluator: dict, reference: str, reference_detail: dict, n: int,
                       sampling: dict, samples: str, config: dict, objective: dict, method: str | None = None,
                       skipped: dict | None = None, checkpoint: str | None = None) -> dict:
    """The one layout of an evaluation record (eval/fid.py's and the online evaluation's)."""
    return {
        "method": method or objective.get("name") or "unknown", "objective": objective,
        "step": sampling.get("step"), "metrics": metrics, "skipped": skipped or {}, "evaluator": evaluator,
        "reference": reference, "reference_detail": reference_detail, "n": n, "sampling": sampling,
        "seed": sampling.get("seed"), "samples": samples, "checkpoint": checkpoint, "run_config": config,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"


def record_name(record: dict) -> str:
    """SAMPLES__REFERENCE__EXTRACTOR.json: re-evaluating the same way replaces the old record."""
    samples = Path(str(record["samples"])).stem
    reference = Path(str(record["reference"]).replace(":", "-")).stem
    ev = record["evaluator"]
    fe = ev["feature_extractor"] if isinstance(ev, dict) else str(ev)
    return f"{_slug(samples)}__{_slug(reference)}__{_slug(fe)}.json"


def write_record(record: dict, path: str | os.PathLike) -> Path:
    """Write ``record`` (with provenance unless it has one) to a .json path or a folder's record_name()."""
    path = Path(path)
    if path.suffix != ".json":
        path = path / record_name(record)
    if "provenance" not in record:
        record = {**record, "provenance": {"eval": provenance_lib.provenance(),
                                           "run": run_provenance(path.parent, record.get("checkpoint"))}}
    return write_text_atomic(path, json.dumps(record, indent=2) + "\n")


def run_provenance(folder: Path, checkpoint: str | None) -> dict | None:
    """Latest RUN/provenance.json session of the run above RUN/eval/, else the checkpoint's run; or None."""
    runs = [folder.parent] if folder.name == "eval" else []
    runs += [run_dir_from_meta({"checkpoint": checkpoint}), Path(checkpoint)] if checkpoint else []
    return next((found[-1] for run in runs if run and (found := provenance_lib.read_sessions(run))), None)


def record_provenance(rec: dict) -> dict | None:
    """The provenance of the run a read record came from (None for records written before provenance)."""
    return (rec.get("provenance") or {}).get("run")


def provenance_warning(recs: list[dict]) -> str | None:
    """One line naming what differs (code, versions, data) between the runs of ``recs``, else None."""
    known = [(run_folder(r), p) for r in recs if (p := record_provenance(r))]
    folders = [str(f) for f, _ in known if f is not None]
    common = os.path.commonpath(folders) if len(folders) == len(known) and folders else None

    def label(folder):
        return os.path.relpath(folder, common) if common else str(folder)

    differ: dict[str, set] = {}
    for folder, p in known[1:]:
        for what in provenance_lib.differences(known[0][1], p):
            differ.setdefault(what, set()).add(label(folder))
    if not differ:
        return None
    parts = [f"{what} ({', '.join(sorted(names))} vs {label(known[0][0])})" for what, names in differ.items()]
    return "the compared runs differ in " + "; ".join(parts)


def run_folder(rec: dict) -> Path | None:
    """The run folder a read record belongs to (RUN/eval/x.json), else its checkpoint's run."""
    if rec.get("_file") and Path(rec["_file"]).parent.name == "eval":
        return Path(rec["_file"]).parent.parent
    return run_dir_from_meta({"checkpoint": rec.get("checkpoint")})


def commit_text(rec: dict) -> str:
    """The commit cell of a record: its run's code (mutor2d.provenance.code_text)."""
    return provenance_lib.code_text((record_provenance(rec) or {}).get("code"))


def read_records(paths) -> tuple[list[dict], list[str]]:
    """Records from run folders (eval/*.json) and JSON files -> (records, notes on empty folders)."""
    records, notes = [], []
    for p in map(Path, paths):
        if p.is_dir():
            files = sorted((p / "eval").glob("*.json"))
            if not files:
                notes.append(f"{p}: no eval/*.json records")
        elif p.is_file():
            files = [p]
        else:
            raise RecordError(f"{shown_path(p)}: no such run folder or record file")
        for f in files:
            try:
                rec = json.loads(f.read_text())
            except (OSError, ValueError) as e:                 # JSONDecodeError, UnicodeDecodeError
                raise RecordError(f"{f}: not a readable JSON record ({e})") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("metrics"), dict):
                raise RecordError(f"{f}: not an evaluation record (no 'metrics' object)")
            rec.setdefault("_file", str(f))
            records.append(rec)
    return records, notes


def objective_summary(objective: dict) -> str:
    """The objective config's ``describe()``, else (no registered objective reads them) the key=value list."""
    try:
        cfg = config.make("objective", **objective)
    except config.ConfigError:
        return ", ".join(f"{k}={v}" for k, v in objective.items() if k != "name")
    return cfg.describe()


def show_paper(records: list[dict], paper: bool | None) -> bool:
    """Whether the paper's rows apply: ``paper`` when given, else whether a record's reference names ImageNet."""
    return paper if paper is not None else any("imagenet" in str(r.get("reference", "")).lower() for r in records)


def _num(v, digits: int) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def _evaluator_text(ev: dict) -> str:
    if not isinstance(ev, dict):
        return str(ev)
    text = f"{ev.get('feature_extractor', '?')} (torch-fidelity {ev.get('version', '?')})"
    if ev.get("weights_sha256"):
        text += f" w:{ev['weights_sha256'][:8]}"
    return text


def data_sets(rec: dict) -> tuple[str | None, str | None]:
    """(samples' data set: the run's data.name, reference's: NAME of NAME:SPLIT); None where unknown."""
    samples = ((rec.get("run_config") or {}).get("data") or {}).get("name")
    return samples, reference_data_set(str(rec.get("reference", "")))


def other_data_set(rec: dict) -> bool:
    """True for a record whose reference is of another data set than its samples (older records)."""
    samples, reference = data_sets(rec)
    return None not in (samples, reference) and samples != reference


def data_set_warning(recs: list[dict]) -> str | None:
    """One line naming the records whose reference is of another data set than their samples; None if none."""
    bad = [f"{Path(r.get('_file', '?')).name} ({' against '.join(map(str, data_sets(r)))})"
           for r in recs if other_data_set(r)]
    return (f"{len(bad)} record(s) scored samples against a reference of another data set, their rows marked "
            f"'other data set' (the metrics measure how the data differ, not the model): {', '.join(bad)}"
            if bad else None)


def _reference_text(rec: dict) -> str:
    ref = str(rec.get("reference", "?"))
    name = ref if ref.startswith("digits:") else Path(ref).name
    if (rec.get("reference_detail") or {}).get("stored_stats") and rec.get("evaluator", {}).get("fid_reference") \
            == "stored mu/sigma":
        name += " (stored stats)"
    if other_data_set(rec):
        name += f" (other data set: samples of {data_sets(rec)[0]})"
    return name


def sort_key(rec: dict):
    return (str(rec.get("reference")), rec.get("method", ""), objective_summary(rec.get("objective") or {}),
            rec.get("step") if rec.get("step") is not None else -1)


def _table_row(rec: dict, extra: list[str]) -> list[str]:
    m = rec["metrics"]
    return [run_name(rec), rec.get("method", "?"), objective_summary(rec.get("objective") or {}),
            "–" if rec.get("step") is None else str(rec["step"]), _num(m.get("fid"), 2), _num(m.get("is"), 1),
            _num(m.get("precision"), 3), _num(m.get("recall"), 3), *(_num(m.get(k), 3) for k in extra),
            commit_text(rec), _evaluator_text(rec.get("evaluator")), _reference_text(rec),
            str(rec.get("n", "?")), _decode_text(rec), skips_text(run_folder(rec), rec.get("step"))]


def skips_text(run_dir: Path | None, step=None) -> str:
    """Updates the blow-up guard skipped up to ``step``: "0", "3 (1 nonfinite, 2 blowup)", "?" (no log)."""
    from ..engine.runlog import skip_counts, skip_words
    if run_dir is None or not (Path(run_dir) / "log.jsonl").is_file():
        return "?"
    return skip_words(skip_counts(run_dir, None if step is None else int(step)))


def _decode_text(rec: dict) -> str:
    """``registers K=4: 21.3 fwd/img`` (forwards compare across runs; tokens/s do not, so not shown)."""
    s = rec.get("sampling") or {}
    mode, opts, st = s.get("decode", "plain"), s.get("decode_options") or {}, s.get("decode_stats") or {}
    text = mode + "".join(f" {k}={v}" for k, v in opts.items())
    if st.get("forwards_per_sequence"):
        text += f": {st['forwards_per_sequence']:.1f} fwd/img"
    return text


def markdown_table(records: list[dict], paper: bool | None = None) -> str:
    """Markdown table of the records (columns: ``head``; other scalar metrics after recall), plus
    PAPER_ROWS when ``paper`` (default: any ImageNet record)."""
    std = ("fid", "is", "precision", "recall")
    extra = list(dict.fromkeys(k for r in records for k, v in r["metrics"].items()
                               if k not in std and isinstance(v, (int, float)) and not isinstance(v, bool)))
    head = ["run", "method", "objective", "step", "FID", "IS", "precision", "recall", *extra, "commit", "evaluator",
            "reference", "n", "decoding", "skipped"]
    rows = [_table_row(rec, extra) for rec in sorted(records, key=sort_key)]
    if show_paper(records, paper):
        rows += [["paper", method, objective, "–" if step is None else str(step), _num(fid, 2), _num(is_, 1),
                  "–", "–", *("–" for _ in extra), "–", PAPER_EVALUATOR, PAPER_REFERENCE, "50000",
                  "plain", "–"] for method, objective, step, fid, is_ in PAPER_ROWS]
    return markdown(head, [[cell.replace("|", "/") for cell in row] for row in rows])


def markdown(head: list[str], rows: list[list[str]]) -> str:
    """A markdown table: the ``head`` row, its rule, then one line per row of cells."""
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(row) + " |" for row in rows])


def run_name(rec: dict) -> str:
    """The run folder a record lives in (RUN/eval/x.json), else its checkpoint's run, else "?"."""
    return (run_folder(rec) or Path("?")).name


def plot_fid(records: list[dict], out: str | os.PathLike, paper: bool | None = None) -> Path:
    """PNG of FID against step, a line per (run, decoding, reference, extractor); paper's curves dashed."""
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure state

    series: dict[str, list[tuple[int, float]]] = {}
    for rec in records:
        fid, step = rec["metrics"].get("fid"), rec.get("step")
        if fid is None or step is None:
            continue
        mode = (rec.get("sampling") or {}).get("decode", "plain")
        label = f"{run_name(rec)}: {rec.get('method', '?')} {objective_summary(rec.get('objective') or {})}, {mode}"
        label += f" [{_reference_text(rec)}, {rec.get('evaluator', {}).get('feature_extractor', '?')}]"
        series.setdefault(label, []).append((int(step), float(fid)))
    if not series:
        raise RecordError("no record has both an FID and a training step: nothing to plot")
    fig = Figure(figsize=(8, 5))
    ax = fig.subplots()
    for label, pts in sorted(series.items()):
        ax.plot(*zip(*sorted(pts)), marker="o", label=label)
    if show_paper(records, paper):
        for k, (method, objective) in enumerate(PAPER_METHODS):
            ax.plot(list(PAPER_SCORES), [scores[k][0] for scores in PAPER_SCORES.values()], linestyle="--",
                    marker="x", alpha=0.7, label=f"{method} ({objective})")
    ax.set(xlabel="training step", ylabel="FID")
    ax.grid(alpha=0.3)

    ax.legend(fontsize=7)
    return save_figure(fig, out, dpi=120)


def save_figure(fig, out: str | os.PathLike, dpi: int) -> Path:
    """Lay out ``fig`` and write it to ``out`` (folders made); returns ``out``."""
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    return Path(out)
