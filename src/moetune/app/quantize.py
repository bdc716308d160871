"""`moetune quantize`: a recipe through the engine's own llama-quantize, its output predicted first
(per tensor, the engine's fallbacks included; planned on the hardware where asked) and checked
against the written file after."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moetune.errors import InputError, RuntimeFailure

if TYPE_CHECKING:
    from moetune.engine.quantize import QuantPlan
    from moetune.engine.registry import Engine
    from moetune.model.profile import ModelProfile
    from moetune.run.quantize import Mismatch


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantizeRequest:
    source: Path  # one GGUF file
    recipe: Path
    output: Path | None = None  # default: SOURCE-RECIPE.gguf beside the source
    engine: str | None = None  # whose llama-quantize runs (default: the default engine)
    imatrix: Path | None = None
    allow_requantize: bool = False
    threads: int | None = None
    hw: str | None = None  # also plan the output on this hardware
    force: bool = False  # overwrite the output
    dry_run: bool = False  # a dry run needs no build: the command names the tool


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """The output predicted: the quant plan, the exact command, where it goes, and the document
    (--json) with the plan on the hardware in ``doc["plan"]`` where ``hw`` was given."""

    profile: ModelProfile
    plan: QuantPlan
    engine: Engine
    output: Path
    argv: list[str]
    doc: dict[str, Any]

    @property
    def fallbacks(self) -> list[Any]:
        return [t for t in self.plan.tensors if t.fallback]


@dataclass(frozen=True, slots=True, kw_only=True)
class Quantized:
    """The file written, its log, and the tensors that differ from the prediction."""

    prediction: Prediction
    log: Path
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def doc(self) -> dict[str, object]:
        return {
            **self.prediction.doc,
            "written": {
                "path": str(self.prediction.output),
                "log": str(self.log),
                "matches_prediction": not self.mismatches,
                "mismatches": [
                    {"name": b.name, "predicted": b.predicted, "written": b.written} for b in self.mismatches
                ],
            },
        }

    def failure(self) -> RuntimeFailure | None:
        if not self.mismatches:
            return None
        out, bad = self.prediction.output, self.mismatches
        return RuntimeFailure(
            f"{out}: {len(bad)} tensors differ from the prediction, first {bad[0].name}: "
            f"predicted {bad[0].predicted}, written {bad[0].written}",
            hint="report this: moetune's model of llama-quantize is out of date for this build",
        )


def mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


def predict(req: QuantizeRequest) -> Prediction:
    """The output's types and bytes per tensor and the llama-quantize command; InputError for a
    recipe the engine cannot follow."""
    from moetune.engine import registry
    from moetune.engine.dialect import quantize_argv
    from moetune.engine.quantize import plan_quantize
    from moetune.model.profile import load_profile
    from moetune.model.recipe import default_output, load_recipe
    from moetune.paths import readable_file

    recipe = load_recipe(req.recipe)
    profile = load_profile(req.source)
    if len(profile.files) > 1:
        raise InputError(
            f"{req.source}: a split model ({len(profile.files)} files)",
            hint="merge it first (llama-gguf-split --merge), then quantize the one file",
        )
    engine = registry.get(registry.resolve(req.engine)[0])
    qp = plan_quantize(
        profile, recipe, engine.kind, imatrix=req.imatrix is not None, allow_requantize=req.allow_requantize
    )
    out = req.output or default_output(req.source, req.recipe)
    if req.imatrix is not None:
        readable_file(req.imatrix, "imatrix")
    try:
        binary = str(engine.binary("quantize"))
    except InputError:
        if not req.dry_run:
            raise
        binary = "llama-quantize"
    argv = quantize_argv(
        kind=engine.kind,
        binary=binary,
        source=str(req.source),
        output=str(out),
        ftype=qp.ftype,
        rules=[(p, t.name) for p, t in qp.rules],
        imatrix=str(req.imatrix) if req.imatrix else None,
        allow_requantize=qp.requantize,
        threads=req.threads,
    )
    doc = prediction_json(qp, profile.total_bytes, argv, source=str(req.source), output=str(out))
    if req.hw is not None:
        doc["plan"] = _plan_on(req.hw, req.source, recipe=req.recipe, out=out, engine=engine.name)
    return Prediction(profile=profile, plan=qp, engine=engine, output=out, argv=argv, doc=doc)


def quantize(
    req: QuantizeRequest, pred: Prediction, progress: Callable[[int, int, str], None] | None = None
) -> Quantized:
    """Run llama-quantize (``progress``: tensor i of n, its name) and check the written file."""
    import shutil

    from moetune.run.quantize import check_written, run_quantize

    engine, out, qp = pred.engine, pred.output, pred.plan
    if engine.bin_dir is None:
        raise InputError(
            f"engine {engine.name} is a container image; quantize needs a local build",
            hint="use --engine with a build (`moetune engine list`)",
        )
    if out.exists() and not req.force:
        raise InputError(f"{out} exists", hint="give --force to overwrite it, or another -o")
    if out.resolve() == req.source.resolve():
        raise InputError("the output is the source", hint="give another -o")
    free = shutil.disk_usage(out.parent if out.parent.exists() else Path(".")).free
    if free < qp.nbytes:
        raise InputError(
            f"{out.parent}: {mib(free)} free, the output needs {mib(qp.nbytes)}",
            hint="free some space or write elsewhere with -o",
        )
    log = out.with_name(out.name + ".log")
    run_quantize(pred.argv, log, progress)
    return Quantized(prediction=pred, log=log, mismatches=check_written(qp, out))


def prediction_json(
    qp: QuantPlan, source_bytes: int, argv: list[str], *, source: str, output: str
) -> dict[str, object]:
    return {
        "source": source,
        "output": output,
        "engine_kind": str(qp.kind),
        "ftype": qp.ftype,
        "command": argv,
        "source_bytes": source_bytes,
        "bytes": qp.nbytes,
        "bytes_by_type": qp.bytes_by_type(),
        "rules": [{"pattern": p, "type": t.name.lower()} for p, t in qp.rules],
        "tensors": [
            {
                "name": t.name,
                "layer": t.layer,
                "role": t.role,
                "shape": list(t.shape),
                "source_type": t.source_type,
                "type": t.type,
                "bytes": t.nbytes,
                "rule": t.rule,
                "fallback": t.fallback or None,
            }
            for t in qp.tensors
        ],
        "warnings": [{"message": m, "remedy": r} for m, r in qp.warnings],
    }


def _plan_on(hw: str, source: Path, *, recipe: Path, out: Path, engine: str) -> dict[str, object]:
    """The output planned on the hardware with the default settings (`moetune plan --recipe`)."""
    from moetune.app.plan import PlanRequest, plan

    doc = plan(PlanRequest(hw=hw, model=source, engine=engine, recipe=recipe, recipe_output=out)).doc
    return {
        "fits": doc["fits"],
        "predicted": doc["predicted"],
        "devices": [
            {
                "name": d["name"],
                "capacity_mib": d["capacity_mib"],
                "used_mib": d["used_mib"],
                "weights_mib": sum(i["mib"] for i in d["items"] if i["what"] == "weights"),
            }
            for d in doc["devices"]
        ],
    }
