"""``replay steptime``: what does one forward step cost, without a trace?"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from replay.base.errors import ConfigError
from replay.commands._common import console, user_errors


def parse_prefill(text: str) -> tuple[int, int]:
    """'2048' -> (2048, 0); '2048@6144' -> 2,048 new tokens over 6,144 cached."""
    new, _, cached = text.partition("@")
    try:
        n, p = int(new), int(cached or 0)
    except ValueError:
        raise ConfigError(f"--prefill {text!r}: expected N or N@CACHED, e.g. 2048 or 2048@6144") from None
    if n <= 0 or p < 0:
        raise ConfigError(f"--prefill {text!r}: needs N > 0 new tokens and CACHED >= 0")
    return n, p


def parse_decode(text: str) -> list[int]:
    """'64x2048' -> 64 decodes at context 2,048; '2048' -> one decode."""
    count, sep, ctx = text.partition("x")
    try:
        b, c = (int(count), int(ctx)) if sep else (1, int(count))
    except ValueError:
        raise ConfigError(f"--decode {text!r}: expected BxCONTEXT or CONTEXT, e.g. 64x2048") from None
    if b <= 0 or c <= 0:
        raise ConfigError(f"--decode {text!r}: batch and context must be > 0")
    return [c] * b


_PART_LABELS = {
    "linear": "linear layers (+ LM head)", "prefill_attn": "prefill attention", "decode_attn": "decode attention",
    "comm": "communication (TP all-reduce)", "layer_overhead": "per-layer overhead", "drafter": "MTP drafter",
    "gpu": "GPU (aiconfigurator)", "mixed_overhead": "mixed/prefill-step overhead",
}


def print_models() -> None:
    """The model catalog: name, architecture, size, and what KV a token costs (BF16, TP1)."""
    from replay.engine.models import get_model, list_models

    table = Table(title="model catalog (--model also takes a Hugging Face config.json path)")
    for col in ("model", "architecture", "params", "layers", "heads q/kv", "experts", "KV bytes/token",
                "max len"):
        table.add_column(col, justify="left" if col in ("model", "architecture") else "right")
    for name in list_models():
        m = get_model(name)
        experts = f"{m.experts_per_token}/{m.num_experts}" if m.is_moe else "-"
        kv = m.kv_elems_per_token_per_layer(1) * 2 * m.num_layers
        table.add_row(name, m.architecture, f"{m.total_params / 1e9:.1f}B", str(m.num_layers),
                      f"{m.num_q_heads}/{m.num_kv_heads}", experts, f"{kv:,}", f"{m.max_position_embeddings:,}")
    _print_wide(table)


def _print_wide(table: Table) -> None:
    """A catalog listing is read in full: names are never cut to fit a narrow (or piped) console."""
    from rich.console import Console

    Console(width=max(console.width, 150), force_terminal=console.is_terminal).print(table)


def print_hardware() -> None:
    """The shipped hardware profiles: peaks, memory, TP link, and whether the timing is calibrated."""
    from replay.engine.hardware import get_hardware, list_hardware

    table = Table(title="hardware profiles (hardware: also takes the path of a profile YAML; docs/timing.md)")
    for col in ("hardware", "BF16 TFLOPS", "FP8 TFLOPS", "memory GB", "memory TB/s", "TP link", "GB/s/dir",
                "timing"):
        table.add_column(col, justify="left" if col in ("hardware", "TP link", "timing") else "right")
    for name in list_hardware():
        hw = get_hardware(name)
        g = hw.gpu
        calibrated = "uncalibrated" not in hw.timing.eta_compute.source.lower() \
            and "guess" not in hw.timing.eta_compute.source.lower()
        table.add_row(name, f"{g.bf16_dense_flops.value / 1e12:,.0f}", f"{g.fp8_dense_flops.value / 1e12:,.0f}",
                      f"{g.hbm_bytes.value / 1e9:,.0f}", f"{g.hbm_bw.value / 1e12:.2f}", g.tp_link,
                      f"{hw.tp_link_bw(2) / 1e9:,.0f}" + (" per link" if g.tp_link == "xgmi" else ""),
                      "fitted (kernel data)" if calibrated else "uncalibrated")
    _print_wide(table)


def steptime(
    model: str = typer.Option("meta-llama/Llama-3.1-8B", "--model", "-m",
                              help="Catalog name or alias (--list-models), or a config.json path."),
    prefill: list[str] = typer.Option([], "--prefill", "-p", help="N new tokens, or N@CACHED. Repeatable."),
    decode: list[str] = typer.Option([], "--decode", "-d", help="BxCONTEXT decodes (e.g. 64x2048). Repeatable."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel size."),
    hardware: str = typer.Option("h200_sxm", "--hardware",
                                 help="Hardware profile name (--list-hardware) or profile YAML path."),
    dtype: str = typer.Option("bf16", "--dtype", help="Weight dtype: bf16 or fp8."),
    kv_dtype: str = typer.Option("auto", "--kv-dtype", help="KV cache dtype: auto, bf16 or fp8."),
    drafts: int = typer.Option(0, "--drafts", "-k", help="MTP draft tokens per decode (speculative decoding)."),
    drafter: str = typer.Option("model", "--drafter", help="MTP drafter: model (its MTP head) or synthetic."),
    backend: str = typer.Option("roofline", "--backend", help="roofline or aic (aiconfigurator-core)."),
    profile: Path | None = typer.Option(None, "--profile", help="Calibrated profile YAML (replay calibrate)."),
    host_overhead_ms: float | None = typer.Option(None, "--host-overhead-ms", help="Override the per-step host overhead."),
    mixed_layer_us: float | None = typer.Option(None, "--mixed-layer-us",
                                                help="Extra cost per layer (us) of a step with a prefill chunk."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    list_models: bool = typer.Option(False, "--list-models", help="List the model catalog and exit."),
    list_hardware: bool = typer.Option(False, "--list-hardware", help="List the hardware profiles and exit."),
) -> None:
    """Predict one forward step's time and its breakdown (GPU time = step_ms - host_overhead_ms).
    --list-models and --list-hardware show the catalog."""
    if list_models or list_hardware:
        with user_errors():
            if list_models:
                print_models()
            if list_hardware:
                print_hardware()
        return
    with user_errors():
        from replay.engine.config import EngineConfig
        from replay.engine.timing import build_timer, shape_from_requests

        prefills = [parse_prefill(p) for p in prefill]
        decodes = [c for d in decode for c in parse_decode(d)]
        if not prefills and not decodes:
            raise ConfigError("give at least one --prefill or --decode, e.g. --prefill 2048 --decode 64x2048")
        data: dict = {"model": model, "hardware": hardware, "tensor_parallel_size": tp, "dtype": dtype,
                      "kv_cache": {"cache_dtype": kv_dtype},
                      "timing": {"backend": backend, "profile": str(profile) if profile else None,
                                 "host_overhead_ms": host_overhead_ms, "mixed_layer_us": mixed_layer_us}}
        if drafts:
            data["speculative"] = {"num_speculative_tokens": drafts, "drafter": drafter}
        try:
            config = EngineConfig.model_validate(data)
        except ValueError as exc:
            raise ConfigError(f"invalid option: {exc}") from None
        timer = build_timer(config)
        shape = shape_from_requests(prefills, decodes, drafts=drafts if decodes else 0,
                                    spec_passes=drafts)
        bd = timer.breakdown(shape)
        if as_json:
            out = {"model": model, "hardware": hardware, "backend": backend, "tensor_parallel_size": tp,
                   "step_ms": bd.step_ms, "host_overhead_ms": bd.host_overhead_ms,
                   "gpu_ms": bd.step_ms - bd.host_overhead_ms, **bd.parts,
                   "shape": {k: getattr(shape, k) for k in shape.__dataclass_fields__}}
            typer.echo(json.dumps(out, sort_keys=True))
            return
        table = Table(title=f"{model} on {hardware} (tp={tp}, {dtype}, backend {backend})")
        table.add_column("part")
        table.add_column("ms", justify="right")
        table.add_column("share", justify="right")
        for key, ms in bd.parts.items():
            if ms or key in ("linear", "layer_overhead"):
                table.add_row(_PART_LABELS.get(key, key), f"{ms:.3f}", f"{ms / bd.step_ms:.0%}")
        table.add_row("host overhead (uncalibrated)", f"{bd.host_overhead_ms:.3f}",
                      f"{bd.host_overhead_ms / bd.step_ms:.0%}")
        table.add_row("[bold]step[/]", f"[bold]{bd.step_ms:.3f}[/]", "100%")
        console.print(table)
        console.print(f"{len(prefills)} prefill request(s), {shape.prefill_tokens} new tokens over "
                      f"{shape.prefill_ctx_tokens} cached; {len(decodes)} decode(s), "
                      f"{shape.decode_ctx_tokens} KV tokens read", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("steptime")(steptime)
