"""``shadowlab logs``' outputs: the text summary, the HTML page and its log-scale bins.
Split out of `shadowlab.logs.analysis` (``shadowlab logs``), which re-exports the names its importers use."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from shadowlab.escape import visible as terminal_safe  # records' terminal_safe, without importing records
from shadowlab.logs.figures import PERCENTILES


# --------------------------------------------------------------------------- outputs


def json_text(doc: dict[str, Any]) -> str:
    """`--json`'s text: `doc` indented by one space a level as ``json.dumps(doc, indent=1,
    ensure_ascii=True)`` writes it, but each request of ``requests`` on a line of its own, a
    table of rows. An indented dump runs json's pure-Python encoder: on a 0.3 GB log its 200
    rows were a fifth of the command's time; one row a line is the C encoder's. ASCII JSON holds
    no raw newline inside a string, so a value's lines are indented by a replace."""
    row = json.JSONEncoder(ensure_ascii=True).encode
    parts = []
    for key, value in doc.items():
        if key == "requests" and value:
            text = "[\n" + ",\n".join("  " + row(r) for r in value) + "\n ]"
        else:
            text = json.dumps(value, indent=1, ensure_ascii=True).replace("\n", "\n ")
        parts.append(f" {json.dumps(key, ensure_ascii=True)}: {text}")
    return "{\n" + ",\n".join(parts) + "\n}" if parts else "{}"


def summary(doc: dict[str, Any]) -> str:
    """The terminal summary. Everything that came from a log goes through terminal_safe."""
    out: list[str] = []
    add = out.append
    add(f"shadowlab logs: {doc['readable_files']} file(s) read, {doc['lines_read']:,} lines, "
        f"{doc['lines_not_understood']:,} not understood")
    for s in doc["servers"]:
        add("")
        add(f"server {s['server']} ({s['family']}, {len(s['files'])} piece(s), times {s['time']})")
        _figures_lines(s["figures"], add, "  ")
        if len(s["slots"]) > 1:
            for slot, f in s["slots"].items():
                oc = f["outcomes"]
                add(f"  slot {slot}: {f['requests']} requests, " + ", ".join(f"{k} {v}" for k, v in oc.items()))
        for n in s["notes"]:
            add(f"  note: {n}")
    if len(doc["servers"]) > 1:
        add("")
        add("overall")
        _figures_lines(doc["overall"], add, "  ")
    for f in doc["files"]:
        if f["not_understood"]:
            add(f"not understood in {f['path']}: {f['not_understood']}")
            for smp in f["samples"][:3]:
                where = "last line (cut short)" if smp["line"] == -1 else f"line {smp['line']}"
                add(f"  {where}: {smp['text'][:160]}")
    for u in doc["unreadable_files"]:
        add(f"unreadable: {u['path']}: {u['why']}")
    for d in doc["damaged_files"]:
        add(f"damaged: {d['path']}: {d['why']}")
    return terminal_safe("\n".join(out)) + "\n"


def _fmt(v: Any, spec: str = ",") -> str:
    if v is None:
        return "-"
    return format(v, spec)


def _figures_lines(f: dict[str, Any], add: Any, ind: str) -> None:
    oc, ev, sp, pt = f["outcomes"], f["events"], f["shared_prefix"], f["prompt_tokens"]
    add(f"{ind}requests {f['requests']:,}: " + ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in oc.items()))
    add(f"{ind}events: " + ", ".join(f"{k} {v:,}" for k, v in ev.items()))
    add(f"{ind}forced vs restored: {oc['forced']:,} vs {oc['restored']:,}")
    label = "shared prefix" if sp["stated_by_log"] == sp["n"] else (
        "re-entry point (shared prefix not stated)" if not sp["stated_by_log"] else
        f"shared prefix ({sp['stated_by_log']:,} of {sp['n']:,} stated, the rest re-entry points)")
    add(f"{ind}{label} over {sp['n']:,} warm requests: " + ", ".join(f"{k} {_fmt(sp[k])}" for k, _ in PERCENTILES)
        + f"; under 512: {_pc(sp['share_under_512'])}, 4,096+: {_pc(sp['share_4096_or_more'])}")
    add(f"{ind}prompt tokens: " + ", ".join(f"{k} {_fmt(pt[k])}" for k, _ in PERCENTILES) + f"; sum {pt['sum']:,}")
    add(f"{ind}reusable prefix {f['reusable_tokens']:,} of {pt['sum']:,} prompt tokens ({_pc(f['reusable_share'])}); "
        f"reused {f['reused_tokens']:,}, processed {f['processed_tokens']:,}")
    add(f"{ind}prefill rate {_fmt(f['prefill_tokens_per_s'], ',.0f')} tok/s (measured); avoidable "
        f"{f['avoidable_tokens']:,} tokens = {_fmt(f['avoidable_prefill_s'], ',.1f')} s")
    fl = f["failures"]
    add(f"{ind}failures: placement {fl['placement']:,}, retention {fl['retention']:,} (upper bound), "
        f"baseline loss {fl['baseline_loss']:,}")
    c = f["checkpoint_cost"]
    add(f"{ind}checkpoint cost: {c['created']:,} created ({_fmt(c['created_mib_each'], '.3f')} MiB, "
        f"{_fmt(c['created_ms_each'], '.2f')} ms each), {c['restored']:,} restored ({_fmt(c['restored_mib_each'], '.3f')} MiB, "
        f"{_fmt(c['restored_ms_each'], '.2f')} ms each), {_fmt(c['creations_per_request'], '.2f')} creations per request")
    t0, t1 = f["time_span_s"]
    add(f"{ind}time span: {_fmt(t0, '.3f')} .. {_fmt(t1, '.3f')} s ({_fmt(None if t0 is None else t1 - t0, ',.1f')} s)")


def _pc(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def render_html(doc: dict[str, Any]) -> str:
    from shadowlab import present  # the HTML environment: autoescape, |visible, StrictUndefined

    env = present.environment()
    return env.get_template("logs.html.j2").render(doc=doc, pictures=_pictures(doc), percentiles=PERCENTILES)


def _pictures(doc: dict[str, Any]) -> dict[str, Any]:
    """Numbers the template draws as SVG: log-scale shared-prefix bins and outcomes over time."""
    return {"shared_bins": _log_bins_of(doc), "over_time": doc["over_time"]}


def _log_bins_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The histogram's bins (analyse's `_hist`, a LazyBins: counted only for a picture)."""
    hist = doc.get("_hist")
    return hist() if hist is not None else []


class LazyBins:
    """log_bins(values), counted when first asked for (a picture is drawn) and kept; equal to
    another when their bins are (the values' order does not matter)."""

    __slots__ = ("values", "_bins")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, values: Sequence[int]) -> None:
        self.values = values
        self._bins: list[dict[str, Any]] | None = None

    def __call__(self) -> list[dict[str, Any]]:
        if self._bins is None:
            self._bins = log_bins(self.values)
        return self._bins

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LazyBins) and self() == other()

    def __repr__(self) -> str:
        return f"LazyBins({len(self.values)} values)"


def log_bins(values: Sequence[int]) -> list[dict[str, Any]]:
    """Counts in bins [0], [1,2), [2,4), ... [2^k, 2^(k+1)): equal width on a log scale."""
    if values and min(values) >= 0:  # 0 .bit_length() is 0: one C-speed count
        counts = Counter(map(int.bit_length, values))
    else:
        counts = Counter(0 if v <= 0 else v.bit_length() for v in values)
    if not counts:
        return []
    top = max(counts)
    return [{"lo": 0 if k == 0 else 1 << (k - 1), "hi": 1 if k == 0 else 1 << k, "n": counts.get(k, 0)}
            for k in range(top + 1)]
