"""Named workloads (workloads.yaml): a trace, or how to make one, and our config beside it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from bench.compare.reuse_traffic import ReuseTrafficConfig, write_reuse_trace
from bench.compare.runner import REPO_ROOT, replay_command
from bench.compare.traces import write_reference_trace
from bench.shared import shared_dir

HERE = Path(__file__).resolve().parent
WORKLOADS_FILE = HERE / "workloads.yaml"



class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Generate(Strict):
    """A trace made at run time into the work directory, never into the repository."""

    kind: Literal["reference", "synth", "reuse"]
    # reference: distinct prompts of fixed length (AISimulate's reference workload mtp-g2-120k-b2048)
    requests: int | None = Field(None, gt=0)
    input_tokens: int | None = Field(None, gt=0)
    output_tokens: int | None = Field(None, gt=0)
    hash_block_size: int = Field(512, gt=0)
    # synth: arguments of `replay synth`; "{out}" is replaced by the trace path
    args: list[str] | None = None
    # reuse: the reuse-heavy high-rate shape (bench/compare/reuse_traffic.py)
    reuse: ReuseTrafficConfig | None = None

    @model_validator(mode="after")
    def _fields(self) -> Generate:
        if self.kind == "reference" and None in (self.requests, self.input_tokens, self.output_tokens):
            raise ValueError("generate.kind=reference needs requests, input_tokens and output_tokens")
        if self.kind == "synth" and not self.args:
            raise ValueError("generate.kind=synth needs args (the `replay synth` arguments, with {out})")
        if self.kind == "reuse" and self.reuse is None:
            raise ValueError("generate.kind=reuse needs reuse (the reuse_traffic parameters)")
        return self


class Workload(Strict):
    description: str
    config: str  # relative to the workloads file
    trace: str | None = None  # "{shared}" expands to shared_dir()
    generate: Generate | None = None
    sessions: Literal["refuse", "flatten"] = "refuse"
    timeout_s: float = Field(1800.0, gt=0)

    @model_validator(mode="after")
    def _one_source(self) -> Workload:
        if (self.trace is None) == (self.generate is None):
            raise ValueError("give exactly one of trace or generate")
        return self


class WorkloadFile(Strict):
    workloads: dict[str, Workload]


class WorkloadError(ValueError):
    """A workload that cannot be set up (bad file, missing trace, missing generator)."""


class Skip(Exception):  # noqa: N818 - a control-flow signal, not an error
    """The workload cannot run here now (e.g. a trace or a command that does not exist yet)."""


def load_workloads(path: Path = WORKLOADS_FILE) -> WorkloadFile:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise WorkloadError(f"{path}: {exc}") from None
    try:
        return WorkloadFile.model_validate(data)
    except ValidationError as exc:
        errs = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise WorkloadError(f"{path}: invalid workloads file: {errs}") from None


def resolve_trace(name: str, wl: Workload, workdir: Path, base: Path) -> tuple[Path, list[str]]:
    """Return the trace to compare on, generating it when the workload says how."""
    if wl.trace is not None:
        path = Path(wl.trace.format(shared=shared_dir()))
        if not path.is_absolute():
            path = (base / path).resolve()
        if not path.exists():
            raise Skip(f"trace {path} is absent (set REPLAY_SHARED to the shared directory)")
        return path, []
    gen = wl.generate
    assert gen is not None
    workdir.mkdir(parents=True, exist_ok=True)
    if gen.kind == "reference":
        out = workdir / f"reference_{gen.requests}x{gen.input_tokens}_{gen.output_tokens}_b{gen.hash_block_size}.parquet"
        if not out.exists():
            write_reference_trace(out, requests=gen.requests, input_tokens=gen.input_tokens,
                                  output_tokens=gen.output_tokens, hash_block_size=gen.hash_block_size)
        return out, [f"reference trace generated: {gen.requests} requests of {gen.input_tokens}/"
                     f"{gen.output_tokens} tokens, fresh hash ids per request (block {gen.hash_block_size})"]
    if gen.kind == "reuse":
        assert gen.reuse is not None
        out = workdir / f"{name}.parquet"
        if not out.exists():
            write_reuse_trace(out, gen.reuse)
        return out, [f"reuse-heavy trace generated: {gen.reuse.model_dump_json()}"]
    cmd, env = replay_command()
    probe = subprocess.run([*cmd, "synth", "--help"], capture_output=True, text=True, env=env, cwd=REPO_ROOT)
    if probe.returncode != 0:
        raise Skip("`replay synth` is not available yet in this checkout")
    out = workdir / f"{name}.parquet"
    args = [a.replace("{out}", str(out)) for a in gen.args or []]
    if not out.exists():
        proc = subprocess.run([*cmd, "synth", *args], capture_output=True, text=True, env=env, cwd=REPO_ROOT)
        if proc.returncode != 0:
            raise WorkloadError(f"{name}: `replay synth {' '.join(args)}` failed: {proc.stderr.strip()[-500:]}")
    return out, [f"synthetic trace: replay synth {' '.join(args)}"]
