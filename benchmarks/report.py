"""RESULTS.md from the results dict that run.py writes to results.json."""

from __future__ import annotations

from typing import Any


def _f(v: Any, fmt: str = "{:.2f}", none: str = "—") -> str:
    if v is None:
        return none
    return fmt.format(v)


def _reach(row: dict[str, Any]) -> str:
    if row.get("seconds_to_threshold") is None:
        best = row.get("best_trajectory_psnr")
        return f"not reached (best {best:.1f} dB)" if best is not None else "not reached"
    return f"{row['seconds_to_threshold']:.1f} s (it. {row['iteration_to_threshold']})"


def _case_table(case: dict[str, Any]) -> list[str]:
    rows = case["rows"]
    lbfgs = any(r.get("seconds_per_1000_evaluations") for r in rows)
    head = ["tool", "precision", "iterations", "s / 1000 it."]
    if lbfgs:
        head.append("s / 1000 evaluations")
    head += ["final PSNR (dB)", "final SSIM", f"time to ≥ {case['threshold_db']:.0f} dB", "total s", "load avg (1 min) before → after"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["label"], r.get("dtype", ""), str(r["iterations"]), _f(r["seconds_per_1000_iterations"], "{:.1f}")]
        if lbfgs:
            cells.append(_f(r.get("seconds_per_1000_evaluations"), "{:.2f}"))
        lb, la = r.get("loadavg_before"), r.get("loadavg_after")
        load = f"{lb[0]:.1f} → {la[0]:.1f}" if lb and la else "—"
        cells += [_f(r["psnr"]), _f(r["ssim"], "{:.3f}"), _reach(r), _f(r["total_seconds"], "{:.1f}"), load]
        out.append("| " + " | ".join(cells) + " |")
    ratios = case.get("ratios")
    if ratios:
        cells = ["**gradleak / breaching**", "", "", _f(ratios["seconds_per_1000_iterations"], "**{:.2f}x**")]
        if lbfgs:
            cells.append(_f(ratios["seconds_per_1000_evaluations"], "**{:.2f}x**"))
        cells += [_f(ratios["psnr_difference_db"], "**{:+.2f} dB**"), "",
                  _f(ratios["seconds_to_threshold"], "**{:.2f}x**", "n/a (not both reached)"), "", ""]
        out.append("| " + " | ".join(cells) + " |")
    for label, vr in (case.get("variant_ratios") or {}).items():
        cells = [f"{label} / breaching", "", "", _f(vr["seconds_per_1000_iterations"], "{:.2f}x")]
        if lbfgs:
            cells.append(_f(vr["seconds_per_1000_evaluations"], "{:.2f}x"))
        cells += [_f(vr.get("psnr_difference_db"), "{:+.2f} dB", ""), "", _f(vr["seconds_to_threshold"], "{:.2f}x", "n/a"), "", ""]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _command(res: dict[str, Any]) -> str:
    """The command, with each --note's text replaced by a pointer (the notes are listed below)."""
    text = res["command"]
    for n in res.get("notes") or []:
        text = text.replace(f"--note {n}", '--note "..."')
    return text


# The cases issues 6 and 20 set targets on (cases.py); any other case is reported beside them.
ISSUE_CASES = ("dlg", "ig", "gi")


def _targets(res: dict[str, Any]) -> list[str]:
    """One line per target of issue 6, with the measured number and met / not met."""
    rows = []
    for case in res["cases"]:
        r = case.get("ratios")
        if case.get("skipped") or not r:
            continue
        g = case["rows"][0]
        b = next(x for x in case["rows"] if x["label"] == "breaching")
        t = r["seconds_to_threshold"]
        if t is None:
            who = [x["label"] for x in (g, b) if x.get("seconds_to_threshold") is None]
            speed = f"threshold {case['threshold_db']:.0f} dB not reached by {' and '.join(who)}"
            if "gradleak" in who:
                met = "**no** (gradleak never reaches it)"
            else:
                lower = b["total_seconds"] / g["seconds_to_threshold"]
                speed += (f" (best {b['best_trajectory_psnr']:.1f} dB in {b['iterations']} it.); gradleak "
                          f"{g['seconds_to_threshold']:.1f} s; vs breaching's whole run {b['total_seconds']:.1f} s: "
                          f">= {lower:.1f}x")
                met = "yes: breaching never reaches it" + ("" if lower >= 3 else f" (the lower bound {lower:.1f}x < 3)")
        else:
            speed = (f"gradleak {g['seconds_to_threshold']:.1f} s vs breaching {b['seconds_to_threshold']:.1f} s: "
                     f"gradleak / breaching = {t:.2f}x")
            met = "yes" if t <= 1 / 3 else "**no**"
        psnr_ok = "yes" if r["psnr_difference_db"] >= 0 else "**no**"
        key = case["key"] + ("" if case["key"] in ISSUE_CASES else " (extra case, not an issue target)")
        rows.append(f"| {key}: >= 3x faster to {case['threshold_db']:.0f} dB | {speed} | {met} |")
        rows.append(f"| {key}: final PSNR >= breaching's | {g['psnr']:.2f} vs {b['psnr']:.2f} dB "
                    f"({r['psnr_difference_db']:+.2f}) | {psnr_ok} |")
    for i in res.get("intrinsic") or []:
        rows.append(f"| intrinsic cost <= 2.5x ({i['key']}) | {i['attack_ratio']:.2f}x (naive double backward "
                    f"{i['naive_ratio']:.2f}x) | {'yes' if i['attack_ratio'] <= 2.5 else '**no**'} |")
    sd = res.get("seeds")
    if sd:
        rows.append(f"| G = {sd['seeds']} seeds <= 0.5x {sd['seeds']} sequential runs | {sd['ratio']:.2f}x "
                    f"({sd['batched_total_s']:.1f} s vs {sd['sequential_total_s']:.1f} s) | {'yes' if sd['met'] else '**no**'} |")
    d = res.get("dlg_default")
    if d:
        reach = d.get("seconds_to_mse_1e-4")
        rows.append("| DLG job: MSE <= 1e-4 within 15 s | "
                    + (f"{reach:.1f} s (step {d['iteration_to_mse_1e-4']})" if reach is not None
                       else f"not reached (best {d['best_trajectory_mse']:.1e})")
                    + f" | {'yes' if d['met_time'] else '**no**'} |")
        rows.append(f"| DLG job: final MSE <= 3.3e-6 | {d['final_mse']:.2e} | {'yes' if d['met_final_mse'] else '**no**'} |")
    for key, c in (res.get("whole_runs") or {}).items():
        label = key if key in ISSUE_CASES else f"{key} (extra case, not an issue target)"
        rows.append(f"| {label}: whole default run >= {WHOLE_TARGET:g}x faster than breaching's at equal or better PSNR "
                    f"(issue 20) | {c['whole_run_speedup']:.2f}x, {c['psnr_difference_db']:+.2f} dB | "
                    f"{'yes' if c['met'] else '**no**'} |")
        if key == "dlg":  # the DLG case is the default job itself
            g = c["gradleak"]
            m = final_mse(g)
            to = g.get("seconds_to_threshold")
            rows.append(f"| default `gradleak attack` (attack {c.get('gradleak_attack', 'dlg')}): reaches MSE <= 1e-4 and "
                        f"ends <= 3.3e-6 (issue 20) | final MSE {m:.1e} after {g['total_seconds']:.1f} s"
                        + (f" (breaching's final PSNR after {to:.1f} s)" if to is not None else "")
                        + f" | {'yes' if m <= 3.3e-6 else '**no**'} |")
    if not rows:
        return []
    return ["## Targets (issues 6 and 20) at a glance", "", "| target | measured | met |", "|---|---|---|", *rows, ""]


def _seeds(sd: dict[str, Any]) -> list[str]:
    out = [
        f"## G = {sd['seeds']} seeds as one batched computation vs {sd['seeds']} sequential runs", "",
        f"GradInversion, `{sd['model']}` batch {sd['batch_size']}, 32 px, preset `{sd['preset']}`, group "
        f"`{sd['group']}` (so batched and sequential are the same attack), {sd['iterations']} iterations each; "
        f"sequential = {sd['seeds']} runs with `--seeds 1` and seeds 0..{sd['seeds'] - 1}; wall time of "
        f"`Engine.run` (set-up included), median of {sd['rounds']} round(s), order alternated. Target <= 0.5x.", "",
        "| | batched G = 8 (s) | 8 sequential (s) | batched / sequential | loop only |", "|---|---|---|---|---|",
    ]
    for i, r in enumerate(sd["rows"]):
        out.append(f"| round {i + 1} | {r['batched_total_s']:.2f} | {r['sequential_total_s']:.2f} | "
                   f"{r['ratio_total']:.2f}x | {r['ratio_loop']:.2f}x |")
    out += ["", f"**{sd['ratio']:.2f}x** (target <= {sd['target']}x: {'met' if sd['met'] else 'not met'}). "
            f"Largest pixel difference between the batched candidates and the sequential answers: "
            f"{sd['max_pixel_difference_batched_vs_sequential']:.1e} (float32: the two round differently and the "
            f"gap grows with the iterations; `benchmarks/checks.py` measures it per step count: bit-identical "
            f"starts, ~1e-6 after one step).", ""]
    return out


def _dlg_default(d: dict[str, Any]) -> list[str]:
    c, cr = d["config"], d.get("command_run") or {}
    reach = d.get("seconds_to_mse_1e-4")
    out = [
        "## The DLG job: `gradleak attack` with DLG (issue 6)", "",
        f"Defaults: attack `{c['attack']}`, model `{c['model']}`, data `{c['data']}`, batch {c['batch_size']}, "
        f"seed {c['seed']}; resolved {d.get('resolved')}."
        + (f" **Quick run: {d['quick_iterations_override']} iterations only.**" if d.get("quick_iterations_override") else ""),
        "",
        f"- In-process (the pipeline's client simulation, then the attack on its `Engine` with an observer "
        f"every step, its time taken out): client set-up {d['client_setup_s']:.1f} s; MSE <= 1e-4 reached after "
        + (f"**{reach:.1f} s** (L-BFGS step {d['iteration_to_mse_1e-4']})" if reach is not None else "**never**")
        + f" (target <= 15 s: {'met' if d['met_time'] else 'not met'}); {d['iterations']} steps in "
        f"{d['attack_total_s']:.1f} s ({d.get('trials')} trial(s)); final MSE **{d['final_mse']:.2e}**, PSNR "
        f"{d['final_psnr']:.1f} dB (target MSE <= 3.3e-6: {'met' if d['met_final_mse'] else 'not met'}).",
    ]
    if cr:
        if cr.get("returncode") == 0:
            out.append(f"- The command itself, `{cr['command']}`: {cr['process_wall_s']:.1f} s "
                       f"process wall time (Python start-up, imports, client simulation, attack "
                       f"{_f(cr.get('attack_wall_s'), '{:.1f}')} s, run folder with paper metrics); final MSE "
                       f"{_f(cr.get('final_mse'), '{:.2e}')}.")
        else:
            out.append(f"- The command `{cr['command']}` failed (rc {cr['returncode']}): {cr.get('stderr_tail', '')}")
    out.append("")
    return out


def render_gpu(gpu: dict[str, Any]) -> list[str]:
    """The GPU section of RESULTS.md."""
    info = gpu["device"]
    lines = ["## GPU (issue 6, item 5)", "",
             f"Measured by `benchmarks/gpu.py` on {info.get('gpu', info['device'])} "
             f"({info.get('gpu_memory_gib', '?')} GiB), {gpu['date']}, torch {info['torch']}, CUDA {info.get('cuda')}, "
             f"cuDNN {info.get('cudnn')}; command `{gpu['command']}`; raw numbers in `gpu.json`."
             + (" **Smoke run: harness check only, not results.**" if gpu.get("smoke") else ""), ""]
    paper = gpu.get("paper") or []
    ok = [p for p in paper if "error" not in p]
    if paper:
        first = ok[0] if ok else {"batch_size": "?", "image_size": "?", "seeds": "?", "iterations": "?"}
        lines += [f"GradInversion `paper` preset, `imagenet-samples`, batch {first['batch_size']}, "
                  f"{first['image_size']} px, G = {first['seeds']} seeds, {first['iterations']} timed steps "
                  "(after a 3-step warm-up; no registration fit falls into them); one registration fit timed apart. "
                  "Projected = the paper's 20 000 steps + 150 fits at these rates.", "",
                  "| model | it/s | s / it. | registration fit (s) | peak allocated (GiB) | peak reserved (GiB) | "
                  "projected paper run |", "|---|---|---|---|---|---|---|"]
        for p in paper:
            if "error" in p:
                lines.append(f"| {p['model']} | {p['error']} | | | | | |")
                continue
            if p.get("out_of_memory_at_seeds"):
                lines.append(f"| {p['model']} (G = {p['seeds']}: out of memory at G = "
                             f"{', '.join(map(str, p['out_of_memory_at_seeds']))}) | | | | | | |")
            lines.append(f"| {p['model']} | {p['iterations_per_second']:.2f} | {p['seconds_per_iteration']:.3f} | "
                         f"{p['registration_fit_s']:.2f} | {gib(p['peak_allocated_gib'])} | "
                         f"{gib(p['peak_reserved_gib'])} | {p['projected_paper_run_s'] / 3600:.2f} h |")
        lines.append("")
    for key in ("seeds_224", "seeds_32"):
        sd = gpu.get(key)
        if not sd:
            continue
        if "error" in sd:
            lines += [f"G seeds batched vs sequential ({key}): {sd['error']}.", ""]
            continue
        title = f"{sd.get('image_size', 32)} px" + (" (the CPU benchmark's case)" if key == "seeds_32" else "")
        b = sd.get("batched_s", sd.get("batched_total_s"))
        s = sd.get("sequential_s", sd.get("sequential_total_s"))
        lines += [f"G = {sd['seeds']} seeds batched vs {sd['seeds']} sequential runs, {title}: `{sd['model']}` batch "
                  f"{sd['batch_size']}, {sd['iterations']} iterations each, group none: batched {b:.2f} s, sequential "
                  f"{s:.2f} s, **{sd['ratio']:.2f}x** (target <= 0.5x: {'met' if sd['met'] else 'not met'}); largest "
                  f"pixel difference {sd['max_pixel_difference_batched_vs_sequential']:.1e}.", ""]
    prec = gpu.get("precision")
    if prec and "error" in prec:
        lines += [f"Precision variants: {prec['error']}.", ""]
    elif prec:
        lines += [f"Precision of one GradInversion step (`{prec['model']}`, {prec['image_size']} px, batch "
                  f"{prec['batch_size']}, G = {prec['seeds']}); gradleak's attacks run IEEE float32 on CUDA:", "",
                  "| variant | ms / step | image-gradient difference vs IEEE float32 |", "|---|---|---|"]
        for v in prec["variants"]:
            lines.append(f"| {v['name']} | {v['step_ms']:.1f} | {v['relative_gradient_difference']:.1e} |")
        lines.append("")
    return lines


WHOLE_TARGET = 3.0  # issue 20: the whole default run >= 3x faster than breaching's at equal or better PSNR


def _whole_why(key: str, c: dict[str, Any], floor: dict[str, Any] | None) -> str:
    """One sentence per whole-run case on where its number comes from."""
    g, b = c["gradleak"], c["breaching"]
    to = c.get("gradleak_seconds_to_breaching_final_psnr")
    reach = (f"gradleak passes breaching's final {b['psnr']:.1f} dB after {to:.1f} s of its {g['total_seconds']:.1f} s"
             if to is not None else f"gradleak never reaches breaching's final {b['psnr']:.1f} dB")
    if key == "dlg":
        own = next((a for a in c.get("alternatives") or [] if a["attack"] == "dlg"), None)
        used = g.get("attack_used") or "rgap"  # records before attack_used was kept: R-GAP (make bench 2026-11-26)
        text = (f"{reach}. `gradleak attack`'s default attack is `auto` (the closed-form attacks that apply, kept when "
                f"their answer explains the update, else optimisation): on DLG's LeNet at batch 1 it kept "
                f"{'R-GAP' if used == 'rgap' else used}, {g['total_seconds']:.1f} s, final MSE {final_mse(g):.1e}.")
        if own is not None:
            d = own["run"]
            text += (f" DLG's own method (`--attack dlg`, row below): both tools run DLG's L-BFGS (lr 1, 20 evaluations "
                     f"per step): gradleak makes {d.get('lbfgs_evaluations')} evaluations in float64 and stops once "
                     f"settled, {d['total_seconds']:.1f} s, breaching {b.get('lbfgs_evaluations')} in float32 over "
                     f"{b['iterations']} steps (its L-BFGS converges early, and from then on a step costs one evaluation).")
        if floor:
            run0 = next((r for r in floor["runs"] if r["seed"] == 0 and r["history"] == 100), None)
            if run0 and floor.get("breaching_whole_run_seconds"):
                text += (f" The floor of DLG's own method here (`dlg_floor.json`, {floor['date']}): one evaluation "
                         f"costs {floor['evaluation_ms']['float64']:.2f} ms (float64), so this photo's "
                         f"{run0['evaluations']} evaluations take {run0['floor_seconds']:.1f} s even with an optimiser "
                         f"that costs nothing: at most {run0['speedup_at_floor']:.2f}x breaching's whole run. No "
                         "implementation of DLG's L-BFGS with DLG's settings reaches 3x on this CPU; the closed form, "
                         "the default, does.")
        return text
    if key == "gi":
        d = c["psnr_difference_db"]
        return (f"{reach}. breaching's seethroughgradients runs {b['iterations']} iterations (its preset) and ends "
                f"{abs(d):.1f} dB {'below' if d >= 0 else 'above'} gradleak's cpu preset ({g['iterations']} iterations).")
    if key in ("ig", "ig-convnet"):
        tv = "0.44 on ResNet-18" if key == "ig" else "the authors' 0.1 on this 14-tensor ConvNet"
        return (f"{reach}. Both run Inverting Gradients' signed Adam (lr 0.1, step decay) at their presets' lengths: "
                f"gradleak {_ig_length(g['iterations'])} with alpha_TV per layer ({tv}, "
                f"`benchmarks/ig_tv.json`), breaching {b['iterations']}; " + _per_iteration(g, b))
    return (f"{reach}. Each tool at its preset's length: gradleak {g['iterations']}, breaching {b['iterations']} "
            "iterations.")


def _ig_length(n: int) -> str:
    """gradleak's IG run length, said for what it is: the authors' 4800 (its default until
    2026-11-26) or its own default since, 1000 (attacks/ig.py, benchmarks/ig_iterations_*.json)."""
    if n == 4800:
        return "the authors' 4800 iterations (its default until 2026-11-26)"
    if n == 1000:
        return ("1000 iterations (its default since 2026-11-26, not the authors' 4800, which end farther from the "
                "photo: `benchmarks/ig_iterations_*.json`)")
    return f"{n} iterations"


def _per_iteration(g: dict[str, Any], b: dict[str, Any]) -> str:
    """The whole runs' time per iteration, and whether the speed-up is the length alone."""
    mg, mb = 1000 * g["total_seconds"] / max(1, g["iterations"]), 1000 * b["total_seconds"] / max(1, b["iterations"])
    if 0.8 <= mg / mb <= 1.25:
        return f"the time per iteration is about the same ({mg:.0f} vs {mb:.0f} ms), so the speed-up is the length."
    return (f"the time per iteration differs in this run ({mg:.0f} vs {mb:.0f} ms; see the conditions), so the "
            "speed-up is not the length alone.")


def _baseline(c: dict[str, Any]) -> str:
    """The case's trivial answers (whole_runs.baselines) and which side of them each tool ends."""
    zero, flat = c.get("zero_answer_psnr"), c.get("mean_colour_psnr")
    if zero is None or flat is None:
        return ""
    text = (f" Trivial answers: the zero image of the model's input space (a flat image of its normalisation mean, "
            f"returned without looking at the update) scores {zero:.2f} dB, a flat image of each photo's own mean "
            f"colour {flat:.2f} dB")
    below = [name for name in ("gradleak", "breaching") if c[name]["psnr"] < zero]
    if not below:
        return text + "; both tools end above them." if all(c[n]["psnr"] > flat for n in ("gradleak", "breaching")) \
            else text + "; both tools end above the zero image."
    if len(below) == 2:
        return (text + "; **both tools end below the zero image**: neither rebuilt anything of the photo that PSNR "
                "sees, so this case's PSNR difference compares two failed reconstructions, not leakage.")
    return text + f"; {below[0]} ends below the zero image."


def final_mse(row: dict[str, Any]) -> float:
    """A whole run's final image MSE (older records hold only the PSNR: MSE = 10^(-PSNR/10), pixels in
    [0, 1], exact below the 100 dB cap)."""
    return float(row["mse"]) if row.get("mse") is not None else 10 ** (-row["psnr"] / 10)


def whole_runs_section(cases: dict[str, Any], floor: dict[str, Any] | None = None,
                       known: tuple[str, ...] = ("dlg", "ig", "gi")) -> list[str]:
    """The whole-default-runs table (issue 20) with one line per case on where its number comes from."""
    out = ["| case | measured | gradleak: iterations, s, PSNR | breaching: iterations, s, PSNR | whole-run speed-up | "
           "PSNR difference | gradleak's time to breaching's final PSNR | met |",
           "|---|---|---|---|---|---|---|---|"]
    notes = []
    for key, c in cases.items():
        g, b = c["gradleak"], c["breaching"]
        to = c.get("gradleak_seconds_to_breaching_final_psnr")
        attack = c.get("gradleak_attack")
        out.append(
            f"| {c['title']}" + (f" (`gradleak attack`, attack {attack})" if attack else "")
            + f" | {c['date']}, load {g.get('loadavg_before')} | {g['iterations']}, {g['total_seconds']:.1f} s, "
            f"{g['psnr']:.2f} dB | {b['iterations']}, {b['total_seconds']:.1f} s, {b['psnr']:.2f} dB | "
            f"**{c['whole_run_speedup']:.2f}x** | {c['psnr_difference_db']:+.2f} dB | "
            f"{'%.1f s' % to if to is not None else 'not reached'} | {'yes' if c['met'] else '**no**'} |")
        for alt in c.get("alternatives") or []:
            a = alt["run"]
            ok = alt["whole_run_speedup"] >= WHOLE_TARGET and alt["psnr_difference_db"] >= 0
            out.append(f"| ... same case, {alt['what']} | {c['date']} | {a['iterations']}, {a['total_seconds']:.1f} s, "
                       f"{a['psnr']:.2f} dB | (as above) | **{alt['whole_run_speedup']:.2f}x** | "
                       f"{alt['psnr_difference_db']:+.2f} dB | — | {'yes' if ok else 'no'} (not the default) |")
        kept = (f" breaching's row is kept from its run of {c['breaching_date']} (`--keep-breaching`); gradleak's "
                f"was rerun {c['date']}." if c.get("breaching_date") else "")
        notes.append(f"- {c['title']}: {_whole_why(key, c, floor)}" + kept + _baseline(c)
                     + (f" Conditions: {c['note']}." if c.get("note") else "")
                     + (f" Rows: {c['relabelled']}." if c.get("relabelled") else ""))
    missing = [k for k in known if k not in cases]
    if missing:
        notes.append(f"- Not measured yet: {', '.join(missing)} (`benchmarks/whole_runs.py --cases {','.join(missing)}`; "
                     "breaching's IG run is 24 000 ResNet-18 iterations, ~1.9 h on one thread here).")
    return out + [""] + notes


def gib(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def render_markdown(res: dict[str, Any], gpu: dict[str, Any] | None = None, floor: dict[str, Any] | None = None) -> str:
    """RESULTS.md: the CPU benchmark ``res`` (results.json), when given the GPU run (gpu.json)
    and the floor of DLG's method (dlg_floor.json, read by the whole-runs section)."""
    m, v = res["machine"], res["versions"]
    lines = [
        "# gradleak vs breaching: benchmark results",
        "",
        "Generated by `benchmarks/run.py` (`make bench`) from the numbers it measured; the raw data is in "
        "`results.json` beside this file." + (" **Quick run (`--quick`): harness check only, not results.**"
                                              if res.get("quick") else ""),
        "",
        f"- command: `{_command(res)}`",
        f"- date: {res['date']}, wall time of the whole run {res.get('wall_seconds', 0) / 60:.1f} min",
        f"- machine: {m['nproc']} CPUs (`nproc`), {m['cpu_model']} (/proc/cpuinfo), torch threads {m['torch_threads']} ({m.get('threads_rule', 'as given')}), "
        f"{m['platform']}, Python {m['python']}",
        f"- versions: gradleak {v['gradleak']}, torch {v['torch']} (both venvs), breaching {v['breaching'] or 'not run'}",
        f"- load average (1/5/15 min) at start {res.get('loadavg_start')}, at end {res.get('loadavg_end')}; "
        "per-run 1-min load is in each table. A load above the 2 cores means other work shared the CPU "
        "while timing, and times are inflated by an unknown, varying factor.",
        *([""] + [f"- note: {n}" for n in res.get("notes") or []]),
        "",
        "## How it is measured",
        "",
        "- Same photos for both tools: gradleak draws the batch from `cifar10-samples` (the real CIFAR-10 photos "
        "in the foolbox 3.3.4 wheel, seed 0) and hands the same pixels, labels and global model weights to "
        "breaching's client (`UserSingleStep.compute_local_updates(custom_data=...)`). The "
        "'client gradient check' line under each table compares breaching's shared gradient with gradleak's.",
        "- Neither tool is given the labels; both restore them from the gradient (DLG: optimised jointly).",
        "- Time per 1000 iterations: the attack's optimisation loop only, observer time taken out. "
        "Time to threshold: seconds from calling the attack (its set-up included) to the first logged "
        "iteration whose PSNR reached the threshold, observer time taken out; resolution = log interval.",
        "- PSNR: gradleak's metric code for both tools (`gradleak.metrics.evaluate` on the returned images; "
        "for the trajectory, the same Hungarian pairing + PSNR on snapshots of the current iterate).",
        "- breaching runs in its own venv in a subprocess, with sockets disabled (nothing is downloaded; its "
        "LPIPS-based analysis is never called).",
        "",
    ]
    for case in res["cases"]:
        lines += [f"## {case['title']}", ""]
        if case.get("skipped"):
            lines += [f"Skipped: {case['skipped']}", ""]
            continue
        if case.get("added_after_run"):
            lines += [f"**Added after the run:** {case['added_after_run']}", ""]
        lines.append(f"Photos: {', '.join(case.get('photos', []))} (labels {case.get('labels')}); "
                     f"{case['iterations']} iterations for both tools; threshold {case['threshold_db']:.0f} dB.")
        lines.append("")
        if case.get("iterations_reduced"):
            lines += [f"**Reduced run:** {case['iterations_reduced']}. The issue asks for "
                      f"{case.get('planned_iterations')} iterations; both tools ran the same reduced number "
                      "(each tool's schedule scaled to it).", ""]
        lines += _case_table(case)
        lines.append("")
        b = next((r for r in case["rows"] if r["label"] == "breaching"), None)
        if b is not None and b.get("gradient_rel_diff_vs_gradleak") is not None:
            lines.append(f"Client gradient check: relative L2 difference between breaching's and gradleak's shared "
                         f"gradient = {b['gradient_rel_diff_vs_gradleak']:.1e} (same weights, photos, normalisation, BN mode).")
            lines.append("")
        if case.get("picture"):
            lines.append(f"Picture: `{case['picture']}` (not committed; regenerated by each run).")
            lines.append("")
        for n in case.get("notes", []):
            lines.append(f"- {n}")
        lines.append("")
    for rr in res.get("reruns") or []:
        case = rr["case"]
        lines += [f"## Re-run: {case['title']}", "", rr["why"], "",
                  f"- command: `{rr['command']}`; date {rr['date']}; torch threads {rr['threads']}; load average "
                  f"(1/5/15 min) at start {rr['loadavg_start']}, at end {rr['loadavg_end']}.",
                  f"- {case['iterations']} iterations for both tools; threshold {case['threshold_db']:.0f} dB.", ""]
        lines += _case_table(case)
        lines.append("")
    if res.get("whole_runs") or res.get("whole_runs_skipped"):
        lines += ["## Whole default runs (issue 20)", "",
                  "Each tool at its own default length (gradleak: `gradleak attack`'s defaults; breaching: its preset's "
                  "`max_iterations`), same photos, weights and shared gradient as above; whole-run time includes "
                  f"set-up. Target: >= {WHOLE_TARGET:g}x faster at equal or better final PSNR (`benchmarks/whole_runs.py`).",
                  "", *whole_runs_section(res.get("whole_runs") or {}, floor,
                                          tuple(c["key"] for c in res["cases"] if c["key"] not in (res.get("whole_runs_skipped") or {}))),
                  *[f"- {k}: whole run skipped: {why}" for k, why in (res.get("whole_runs_skipped") or {}).items()], ""]
    if res.get("seeds"):
        lines += _seeds(res["seeds"])
    if res.get("dlg_default"):
        lines += _dlg_default(res["dlg_default"])
    intr = res.get("intrinsic")
    if intr:
        lines += [
            "## Intrinsic cost: gradleak attack step / plain training step",
            "",
            "Same process, same model, batch and precision; median over interleaved rounds. Training step = "
            "forward + backward to the parameters. Attack step = one objective evaluation of the real gradleak "
            "loop (`gradleak.pipeline.attack_update`; for DLG the L-BFGS loop time divided by its evaluations). 'Naive' = forward + "
            "`autograd.grad(create_graph=True)` + squared distance + backward to the input, written directly. "
            "Target: attack step <= 2.5x a training step.",
            "",
            "| model / attack | training step (ms) | naive double-backward (ms) | gradleak attack step (ms) | naive / train | **attack / train** | target <= 2.5x |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in intr:
            ok = "yes" if r["attack_ratio"] <= 2.5 else "**no**"
            lines.append(f"| {r['label']} | {r['train_step_ms']:.2f} | {r['naive_step_ms']:.2f} | {r['attack_step_ms']:.2f} | "
                         f"{r['naive_ratio']:.2f}x | **{r['attack_ratio']:.2f}x** | {ok} |")
        lines.append("")
        lines.append("Per-round attack/train ratios: " + "; ".join(
            f"{r['key']}: " + ", ".join(f"{x:.2f}" for x in r["attack_ratio_rounds"]) for r in intr) + ".")
        lines.append("")
    lines += render_gpu(gpu) if gpu else [
        "## GPU (issue 6, item 5)", "",
        "Not measured: no GPU machine was lent to the sessions that produced these results, so the `paper` "
        "preset at 224 px on `efficientnet-lite0` / `resnet50` (batch 8, 8 seeds) has no iterations-per-second "
        "or memory figures here yet. `benchmarks/gpu.py` measures them (and the G-seed batching and precision "
        "variants on the GPU) when run on a CUDA machine; it writes `gpu.json` and this section.", "",
    ]
    if res.get("reading"):
        reading = ["## Reading these numbers", "", *[f"- {r}" for r in res["reading"]], ""]
    else:
        reading = []
    head = lines[:lines.index("## How it is measured")]
    rest = lines[lines.index("## How it is measured"):]
    return "\n".join(head + _targets(res) + reading + rest) + "\n"


if __name__ == "__main__":  # python benchmarks/report.py [DIR]: RESULTS.md from DIR's results.json (+ gpu.json)
    import json
    import sys
    from pathlib import Path

    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
    gpu_file = folder / "gpu.json"
    floor_file = folder / "dlg_floor.json"
    (folder / "RESULTS.md").write_text(render_markdown(json.loads((folder / "results.json").read_text()),
                                                       json.loads(gpu_file.read_text()) if gpu_file.exists() else None,
                                                       json.loads(floor_file.read_text()) if floor_file.exists() else None))
    print(f"wrote {folder / 'RESULTS.md'}")
