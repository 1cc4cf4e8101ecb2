"""The `dpdistill` command line: every error a user can cause becomes one clear line and a non-zero exit."""

from __future__ import annotations

import json
import shlex
import sys
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import click
import typer
from rich.console import Console
from rich.table import Table

from dpdistill.allocator import keep_freed_memory
from dpdistill.cli.declared import CommandsWithDeclared
from dpdistill.cli.output import clear_errors, progress_display, summary, warn
from dpdistill.defaults import FEDERATED_DELTA, PUBLIC_POOL_SIZE, TEACHER_MIN_STEPS
from dpdistill.errors import ConfigError
from dpdistill.options import OVERWRITE_OPTION, SEED_HELP, dataset_help

# Plain help (click's formatter, no rich markup): it wraps every text at the terminal's width, at most 80 columns,
# where rich's option tables cut names and texts short, and it prints "[default: ...]" as written
typer.core.HAS_RICH = False  # else typer escapes "[default: ...]" for rich markup and plain help shows the escape
app = typer.Typer(cls=CommandsWithDeclared, add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Turn a model trained on private data into a differentially private student and generator.")
data_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                       help="Data sets: what is available and where it comes from.")
app.add_typer(data_app, name="data")
# Options several commands share, declared once
SEED = typer.Option(0, help=SEED_HELP)
DEVICE = typer.Option("cpu", help="cpu or cuda")
ADAM_LR = typer.Option(1e-3, help="Adam's learning rate")
OVERWRITE = OVERWRITE_OPTION.parameter().default


class DemoDataset(str, Enum):  # the data sets dpdistill.demo.SCALES sizes the demo for
    fmnist = "fmnist"
    digits = "digits"


@data_app.command("list")
@clear_errors
def data_list() -> None:
    """Show each built-in data set and whether it is available here."""
    from dpdistill.data import list_datasets

    table = Table("name", "available", "where / how to get it")
    for status in list_datasets():
        table.add_row(status.name, "yes" if status.available else "no", status.detail)
    Console().print(table)


def _check_npz_out(out: Path, overwrite: bool) -> None:
    """A `data` command's --out: an .npz, replaced only when asked, refused before any image is read."""
    if out.suffix != ".npz":
        raise ConfigError(f"--out {out} must end in .npz")
    if out.exists() and not overwrite:
        raise ConfigError(f"--out {out} exists: pass --overwrite to replace it, or choose another --out")


@data_app.command("import")
@clear_errors
def data_import(
    folder: Path = typer.Argument(..., help="images by class: FOLDER/train/CLASS/*.png and FOLDER/test/CLASS/*"),
    out: Path = typer.Option(..., help="the .npz to write (any command then reads it as --dataset OUT)"),
    size: Optional[str] = typer.Option(None, help="resize every image to HxW (e.g. 32x32) [default: keep the one "
                                                  "size they share]"),
    channels: Optional[int] = typer.Option(None, help="1 (grey) or 3 (RGB) [default: 1 where every image is grey]"),
    dataset_size: Optional[int] = typer.Option(None, min=1, help="the training set's size as you publish it, kept as "
                                                                 "the .npz's declared_size (DP-SGD's sampling rate "
                                                                 "and steps come from it) [default: none declared]"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace OUT if it exists"),
) -> None:
    """Read a folder of images by class into one .npz.

    The class folders' names, sorted, give the labels."""
    from dpdistill.data.folders import is_image_folder, parse_size
    from dpdistill.data.sources import import_image_folder

    if not folder.is_dir() or not is_image_folder(folder):
        raise ConfigError(f"{folder} is not a folder of images by class: it needs {folder}/train/CLASS/ and "
                          f"{folder}/test/CLASS/ folders of images")
    _check_npz_out(out, overwrite)
    written = import_image_folder(folder, out, None if size is None else parse_size(size), channels, dataset_size)
    names = ", ".join(written["classes"][:10]) + (", ..." if len(written["classes"]) > 10 else "")
    declared = "" if dataset_size is None else f", declared training-set size {dataset_size}"
    summary.print(f"{out}: {written['train']} train and {written['test']} test images of shape "
                  f"{'x'.join(map(str, written['shape']))}, {len(written['classes'])} classes ({names}){declared}",
                  highlight=False)


@data_app.command("split")
@clear_errors
def data_split(
    dataset: str = typer.Option(..., help=dataset_help("the data set whose training split is divided")),
    validation: int = typer.Option(..., help="how many training images to hold out as the validation split"),
    out: Path = typer.Option(..., help="the .npz to write (any command then reads it as --dataset OUT)"),
    seed: Optional[int] = typer.Option(None, help="hold out a random draw made with this seed [default: the last "
                                                  "VALIDATION images, in the data's own order]"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace OUT if it exists"),
) -> None:
    """Hold out training images as a validation split, in one .npz.

    The .npz's test split is the held-out images: settings chosen on it never read the real test split. Its
    scores are still private data (report them only under a guarantee), and runs on it meet the whole data's in
    the ledger of the individuals."""
    from dpdistill.data import load_dataset
    from dpdistill.data.sources import write_validation_split

    _check_npz_out(out, overwrite)
    written = write_validation_split(load_dataset(dataset), validation, out, seed)
    declared = "" if written["declared_size"] is None else f", declared training-set size {written['declared_size']}"
    summary.print(f"{out}: {written['train']} train and {written['validation']} validation images (its test split) "
                  f"from {dataset}'s training split{declared}; {dataset}'s test split is not in it", highlight=False)


class Have(str, Enum):
    model = "model"
    data = "data"
    public = "public"
    owners = "owners"


@app.command("plan")
@clear_errors
def plan_command(
    dataset: str = typer.Option("fmnist", help=dataset_help("the data set you hold (the figures were "
                                                                            "measured on Fashion-MNIST)")),
    epsilon: float = typer.Option(..., help="the privacy budget you can spend"),
    have: Have = typer.Option(Have.data, help="model: a model trained without privacy; data: the private data; "
                                              "public: the data and public unlabelled images; owners: several "
                                              "data owners"),
) -> None:
    """Which route fits what you have, and what it measured.

    Best first, from the rows of BENCHMARKS.md (Fashion-MNIST)."""
    from dpdistill.guide import HAVE, MEASURED_ON, nearest_epsilon, plan
    from dpdistill.privacy.accounting import validate_epsilon

    validate_epsilon(epsilon)
    routes = plan(dataset, epsilon, have.value)
    measured = nearest_epsilon(epsilon)
    print(f"You have {HAVE[have.value]}, and epsilon {epsilon:g}. Figures: Fashion-MNIST at a sound epsilon of "
          f"{measured}{'' if dataset == MEASURED_ON else ' (measured there, not on ' + dataset + ': a guide only)'}"
          f", rows of BENCHMARKS.md.")
    for index, route in enumerate(routes, 1):
        print(f"\n{index}. {route['route']}\n   {route['command']}")
        if route["limit"]:
            print(f"   cannot help: {route['limit']} ({_measured(route)})")
        else:
            print(f"   {_measured(route)}")


def _measured(route: dict) -> str:
    """What the route's row measured for its printed command, or that no row ran that very command."""
    if route["accuracy"] is None:
        return f"no figure: no benchmark row ran this very command (the row cited here: `{route['row']}`)"
    spread = f" ± {route['spread']:.2f}" if route["spread"] else ""
    minutes = "" if route["minutes"] is None else f" in {route['minutes']:.0f} min on 2 cores"
    return f"measured {route['accuracy']:.2f}%{spread}{minutes} (row `{route['row']}`)"


def parsed_command(line: str) -> tuple[str, dict[str, Any]]:
    """A `dpdistill ...` command line as this command line parses it, without running it: the command's name and
    its options' values (defaults included). A line it would refuse raises click's usage error."""
    words = shlex.split(line)
    if words[:1] != ["dpdistill"]:
        raise click.UsageError(f"not a dpdistill command: {line}")
    group = typer.main.get_command(app)
    name, command, rest = group.resolve_command(group.make_context("dpdistill", words[1:]), words[1:])
    return name, command.make_context(name, rest).params


@app.command("cache")
@clear_errors
def cache_command(clear: bool = typer.Option(False, "--clear", help="remove every stored feature file")) -> None:
    """Show or empty the feature cache.

    Fixed transforms' outputs of data sets: as private as the data."""
    from dpdistill.models.features import cache_limit, cached_files
    from dpdistill.paths import features_home

    files = cached_files()
    size = sum(path.stat().st_size for path in files)
    if clear:
        for path in files:
            path.unlink(missing_ok=True)
        summary.print(f"removed {len(files)} file(s), {size / 1e9:.2f} GB, from {features_home()}", highlight=False)
        return
    print(f"{features_home()}: {len(files)} file(s), {size / 1e9:.2f} GB of a {cache_limit() / 1e9:g} GB limit "
          f"($DPDISTILL_CACHE_LIMIT_GB; the least recently used go first)")


@app.command("train-teacher")
@clear_errors
def train_teacher_command(
    dataset: str = typer.Option(..., help=dataset_help("the private data the teacher learns")),
    out: Path = typer.Option(..., help="directory for model.safetensors, meta.json and report.json"),
    arch: str = typer.Option("cnn", help="architecture name or module:callable"),
    epochs: int = typer.Option(5, min=1),
    batch_size: int = typer.Option(128, min=1),
    lr: float = typer.Option(1e-3),
    partitions: int = typer.Option(1, min=1, help="train an ensemble: one teacher per disjoint partition"),
    dirichlet_alpha: Optional[float] = typer.Option(None, help="simulate owners holding non-IID data: class "
                                                               "proportions ~ Dirichlet(alpha); its releases "
                                                               "have NO formal guarantee (default: keyed IID)"),
    min_steps: int = typer.Option(TEACHER_MIN_STEPS, min=0, help="at least this many optimizer steps per teacher "
                                                                 "(small partitions get more epochs)"),
    augment_shift: int = typer.Option(0, min=0, help="translate training images by up to this many pixels "
                                                     "(0: off; small partitions gain about a point)"),
    init: Optional[Path] = typer.Option(None, help="start every teacher from this pretrained encoder's weights "
                                                   "(a `dpdistill pretrain` directory) instead of random ones; "
                                                   "with --heads-only, 'scatter': heads on scattering features "
                                                   "(no encoder, no public images)"),
    heads_only: bool = typer.Option(False, help="ensemble members are linear heads on the frozen --init features, "
                                                "all trained at once (full batch, max(epochs, min-steps) steps): "
                                                "thousands of members in a minute"),
    weight_decay: float = typer.Option(0.0, min=0.0, help="L2 penalty of Adam"),
    seed: int = SEED,
    device: str = DEVICE,
    resume: bool = typer.Option(False, help="continue the interrupted ensemble training in --out with its saved "
                                            "settings, after its last finished member"),
    budget: Optional[float] = typer.Option(None, help="total epsilon all releases from this teacher may spend "
                                                      "(default: no limit)"),
    budget_delta: float = typer.Option(1e-5, help="delta of the total --budget"),
    overwrite: bool = OVERWRITE,
) -> None:
    """Train a non-private teacher, or a teacher ensemble. It is the private model to be converted."""
    from dpdistill.jobs import interrupted_ensemble, train_teacher, train_teacher_ensemble
    from dpdistill.privacy.ledger import Budget, ReleaseLedger
    from dpdistill.training.teacher import TeacherConfig

    total = None if budget is None else Budget(budget, budget_delta)  # checked before hours of training

    config = TeacherConfig(arch=arch, epochs=epochs, batch_size=batch_size, lr=lr, min_steps=min_steps,
                           augment_shift=augment_shift, init=None if init is None else str(init),
                           heads_only=heads_only, weight_decay=weight_decay, seed=seed, device=device)
    if partitions == 1 and (dirichlet_alpha is not None or heads_only):
        raise typer.BadParameter("--dirichlet-alpha and --heads-only shape an ensemble: use them with --partitions > 1")
    if partitions > 1 or resume:
        plan = interrupted_ensemble(out) if resume else None
        if plan:  # the bar counts what the saved settings train
            partitions, config = plan["partitions"], TeacherConfig(**plan["config"])
        with (progress_display(config.full_batch_steps, f"{partitions} heads on {dataset}, step") if config.heads_only
              else progress_display(partitions, f"{partitions} teachers on {dataset}")) as update:
            report = train_teacher_ensemble(dataset, out, config, partitions, dirichlet_alpha, update, resume,
                                            overwrite)
        accuracy = report["accuracy"]
        summary.print(f"ensemble of {partitions}: test accuracy {100 * accuracy['teacher']:.2f}% (plurality vote "
                      f"{100 * accuracy['plurality_vote']:.2f}%, members {100 * accuracy['member_min']:.1f}-"
                      f"{100 * accuracy['member_max']:.1f}%) -> {out}")
    else:
        with progress_display(epochs, f"teacher on {dataset}") as update:
            report = train_teacher(dataset, out, config, update, overwrite)
        summary.print(f"teacher test accuracy {100 * report['accuracy']['teacher']:.2f}% -> {out}")
    if total is not None:
        ReleaseLedger(out).set_total(total.epsilon, total.delta)
        summary.print(f"privacy budget of its releases: epsilon {total.epsilon:g} at delta {total.delta:g}")


@app.command("federated owner")
@clear_errors
def federated_owner_command(
    teacher: Path = typer.Option(..., help="your teacher ensemble (`dpdistill train-teacher --partitions N` on your "
                                           "data): its members answer; its ledger.json keeps what you spent"),
    superlink: str = typer.Option(..., help="HOST:PORT of the server's SuperLink (`dpdistill federated serve`)"),
    root_certificates: Path = typer.Option(..., help="the federation's CA certificate (ca.crt), to trust the "
                                                     "server"),
    delta: float = typer.Option(FEDERATED_DELTA, help="the delta your epsilon is stated at: your client answers "
                                                      "only runs planned at it (the server's --delta)"),
) -> None:
    """A data owner's SuperNode, across machines.

    It answers the server's rounds from your teacher and runs until stopped (Ctrl-C). Your client charges every
    run to your own ledger and refuses what your budget
    (`dpdistill budget TEACHER --set EPS`) does not allow."""
    from dpdistill.federated.parties import run_owner

    raise typer.Exit(run_owner(teacher, superlink, root_certificates, delta))


@app.command("budget")
@clear_errors
def budget_command(
    teacher: Optional[Path] = typer.Argument(None, help="a teacher's or teacher ensemble's directory, or a "
                                                         "federation's owners' directory"),
    dataset: Optional[str] = typer.Option(None, help=dataset_help("instead of a teacher, a data set, whose every "
                                                                  "release it shows")),
    set_: Optional[float] = typer.Option(None, "--set", help="set or change the total epsilon of its releases"),
    delta: Optional[float] = typer.Option(None, help="delta of the total set with --set [default: the delta the "
                                                     "spent epsilon is shown at]"),
) -> None:
    """What the releases of a teacher, owners or data spent. --set sets their total budget."""
    from dpdistill.data import load_dataset
    from dpdistill.federated.owners import owner_directories
    from dpdistill.models.ensemble import holds_teacher
    from dpdistill.methods.base import data_read
    from dpdistill.privacy.individuals import DatasetLedger
    from dpdistill.privacy.ledger import ReleaseLedger

    if (teacher is None) == (dataset is None):
        raise ConfigError("give a teacher's directory or --dataset NAME: the ledger of one or the other")
    owners = [] if teacher is None else owner_directories(teacher)
    if teacher is not None and not holds_teacher(teacher) and not owners:
        raise ConfigError(f"{teacher} holds no teacher (model.safetensors), teacher ensemble (ensemble.json), "
                          f"released student (student.safetensors) or data owners (owners.json)")
    ledger = (ReleaseLedger(teacher) if teacher is not None else DatasetLedger(*data_read(load_dataset(dataset), dataset)))
    state = ledger.read() if set_ is None else ledger.set_total(set_, delta)
    standing = ledger.standing(state)
    output = Console()
    output.print(f"ledger: {ledger.path}" + (f" (the individuals in {dataset}: every release that read any of its "
                                             f"examples, under replace-one; spent is its worst-off example's, the "
                                             f"releases that read it added)" if dataset else ""), highlight=False)
    if standing["total_epsilon"] is None:
        output.print("total: none (releases are recorded, never refused)", highlight=False)
    else:
        on = f" (set on {standing['total_on']})" if standing.get("total_on", dataset) != dataset else ""
        output.print(f"total: epsilon {standing['total_epsilon']:g} at delta {standing['delta']:g}{on}",
                     highlight=False)
    output.print(f"spent: epsilon {standing['spent_epsilon']:.4g} at delta {standing['delta']:g}", highlight=False)
    if standing["remaining"] is not None:
        output.print(f"remaining: epsilon {standing['remaining']:.4g}", highlight=False)
    table = Table("method", "out dir", *(["data"] if dataset else []), "epsilon", "status", "date")
    for entry, data in ([(entry, ()) for entry in state.entries] if dataset is None else
                        [(recorded.entry, (recorded.name,)) for recorded in ledger.releases(state)]):
        table.add_row(entry.method, entry.out_dir, *data, f"{entry.release.epsilon:.4g}", entry.status, entry.time)
    output.print(table)
    if owners:  # each owner's own ledger: what its client answered, with its local releases
        table = Table("owner", "spent epsilon", "total")
        for directory in owners:
            own = ReleaseLedger(directory).read()
            table.add_row(directory.name, f"{own.spent():.4g}", "none" if own.total is None else f"{own.total.epsilon:g}")
        output.print(table)


@app.command("evaluate")
@clear_errors
def evaluate_command(
    model: Path = typer.Option(..., help="a teacher, imported teacher, teacher ensemble or run output directory"),
    dataset: str = typer.Option(..., help=dataset_help("the data set whose test split is used")),
    name: Optional[str] = typer.Option(None, help="model file stem (default: the teacher or ensemble, else student)"),
) -> None:
    """Accuracy of a saved model on a real test split. JSON on stdout.

    Test images the model saw as public images are left out, and said so on stderr."""
    from dpdistill.jobs import evaluate

    result = evaluate(model, dataset, name)
    for warning in result["warnings"]:
        warn(warning)
    typer.echo(json.dumps(result, indent=2))


@app.command("import-teacher")
@clear_errors
def import_teacher_command(
    factory: str = typer.Option(..., help="FILE.py:CALLABLE, copied into --out with the code beside it and run on "
                                          "every load (from any directory, no PYTHONPATH), or module:callable, "
                                          "imported by name (it must stay importable); called with those of "
                                          "in_shape, num_classes it accepts"),
    code: Optional[Path] = typer.Option(None, help="the folder of the model's code, its .py files kept with the "
                                                   "teacher [default: the factory file's folder]"),
    weights: Path = typer.Option(..., help="safetensors file of the network's state_dict, under its own keys"),
    dataset: str = typer.Option(..., help=dataset_help("the data set it classifies")),
    out: Path = typer.Option(..., help="new or empty directory for model.safetensors, meta.json, the factory's "
                                       "code and report.json"),
    input_range: Optional[str] = typer.Option(None, help="LOW,HIGH: the pixel range the model was trained on, e.g. "
                                                         "0,1 (torchvision's ToTensor); dpdistill's images are in "
                                                         "[-1, 1] and are mapped inside the model [default: -1,1]"),
    normalize: Optional[str] = typer.Option(None, help="MEAN,STD (or all channels' means, then all their stds) "
                                                       "subtracted and divided after --input-range, as in its "
                                                       "training, e.g. 0.1307,0.3081"),
    overwrite: bool = typer.Option(False, "--overwrite", show_default=False,
                                   help="replace the teacher in a non-empty --out (its release ledger stays: "
                                        "releases already made still count)"),
    dp_epsilon: Optional[float] = typer.Option(None, help="the epsilon its owner declares the model was trained "
                                                          "with under DP: its transcriptions then cost nothing more "
                                                          "(reported as the owner's claim, NOT verified)"),
    dp_delta: float = typer.Option(1e-5, help="with --dp-epsilon: the declared delta"),
    dp_relation: str = typer.Option("add-remove", help="with --dp-epsilon: the neighbouring relation the declared "
                                                       "epsilon is stated under, add-remove (Opacus') or replace-one"),
) -> None:
    """Make a PyTorch classifier trained elsewhere a teacher.

    Its factory file and the code beside it are kept with it; weights come from safetensors only."""
    from dpdistill.models.transform import parse_input_transform
    from dpdistill.jobs import import_teacher
    from dpdistill.privacy.provenance import Provenance

    declared = None if dp_epsilon is None else Provenance.declared(dp_epsilon, dp_delta, dp_relation)
    report = import_teacher(factory, weights, dataset, out, parse_input_transform(input_range, normalize), overwrite,
                            declared, code)
    summary.print(f"imported teacher test accuracy {100 * report['accuracy']['teacher']:.2f}% -> {out}")
    if "reference" in report["factory"]:
        summary.print(f"note: {report['factory']['note']}", highlight=False)
    if declared is not None:
        summary.print(f"declared: {declared.statement()}", highlight=False)
    for warning in report["warnings"]:
        warn(warning)


@app.command("demo")
@clear_errors
def demo_command(
    out: Path = typer.Option(Path("runs/demo"), help="output directory"),
    dataset: DemoDataset = typer.Option(DemoDataset.fmnist, help="fmnist (a few minutes), or digits (seconds, "
                                                                 "the embedded data: a quick check)"),
) -> None:
    """Show the routes that work, on Fashion-MNIST. In a few minutes: DP-SGD on scattering features beside DPSD
    from one teacher, the non-private teacher, a shortened release (a DP-SGD teacher transcribed for free) and
    PATE with an ensemble of scattering heads, at one sound epsilon."""
    from dpdistill.demo import run_demo

    run_demo(out, summary, dataset.value)


@app.command("pretrain")
@clear_errors
def pretrain_command(
    dataset: str = typer.Option(..., help=dataset_help("the data set whose public pool is used (as in "
                                                                    "`dpdistill pate`)")),
    out: Path = typer.Option(..., help="directory for encoder.safetensors, encoder.json and report.json"),
    public: Optional[str] = typer.Option(None, help="data set of the public images (default: the "
                                                    "first --public-size test images of --dataset)"),
    public_size: int = typer.Option(PUBLIC_POOL_SIZE, min=2, help="how many public images to pretrain on (as "
                                                                   "`pate --public-size`)"),
    arch: str = typer.Option("cnn", help="the architecture the encoder will start"),
    steps: int = typer.Option(600, min=1, help="optimizer steps"),
    batch_size: int = typer.Option(256, min=2, help="images a step (two views of each)"),
    temperature: float = typer.Option(0.2, help="of the contrastive loss"),
    lr: float = ADAM_LR,
    seed: int = SEED,
    device: str = DEVICE,
    overwrite: bool = OVERWRITE,
) -> None:
    """Contrastive pretraining on public, unlabelled images. A starting point for teachers and PATE students."""
    from dpdistill.jobs import pretrain
    from dpdistill.training.self_supervised import ContrastiveConfig

    config = ContrastiveConfig(arch=arch, steps=steps, batch_size=batch_size, temperature=temperature, lr=lr,
                               seed=seed, device=device)
    with progress_display(steps, "contrastive pretraining steps") as update:
        report = pretrain(dataset, public, public_size, config, out, update, overwrite)
    summary.print(f"encoder pretrained on {report['public']}: loss {report['history'][-1]['loss']:.3f} in "
                  f"{report['timing']['wall_seconds']:.0f} s -> {out}")


@app.command("audit")
@clear_errors
def audit_command(
    dataset: str = typer.Option(..., help=dataset_help("the private data set the canaries go into")),
    out: Path = typer.Option(..., help="directory for report.json, report.md, scores.png, inversion.png and the "
                                       "route's run"),
    method: str = typer.Option("dpsgd", help="the audited route, as its method declares it: dpsgd, datalens, "
                                             "dp-merf, pate, dgd, dpsd, dpdfd, srr, or nonprivate (the reference: "
                                             "the student without privacy)"),
    canaries: int = typer.Option(1000, help="mislabelled training examples, each included with probability 1/2"),
    epsilon: Optional[float] = typer.Option(None, help="the route's privacy budget: the claim audited"),
    delta: float = typer.Option(1e-5, help="the route's delta, and the audit's"),
    student_arch: Optional[str] = typer.Option(None, help="the student's architecture [default: the route's; "
                                                          "scatter-linear for nonprivate and dpsgd]"),
    epochs: Optional[int] = typer.Option(None, help="nonprivate and dpsgd: the student's epochs"),
    teachers: Optional[int] = typer.Option(None, help="teacher routes: ensemble members, heads on scattering "
                                                      "features (1: one teacher) [default: 250 for pate and dgd, "
                                                      "1 for transcriptions]"),
    teacher_arch: str = typer.Option("cnn", help="a single teacher's architecture (and DGD's baseline)"),
    preset: Optional[str] = typer.Option(None, help="transcription and synthesis routes: their preset"),
    set_: list[str] = typer.Option([], "--set", help="any setting of the route, KEY=VALUE (repeatable), as its "
                                                     "own command's --set"),
    inversion: bool = typer.Option(True, help="reconstruct each class from the released student"),
    shadows: int = typer.Option(0, help="offline LiRA: shadow models of the student, each on half the data "
                                        "without the canaries (0: off)"),
    white_box: bool = typer.Option(False, help="dpsgd: gradient canaries of norm C in the optimizer's clipped "
                                               "sum, scored from every noisy gradient"),
    seed: int = typer.Option(0, help="which canaries and which are included (the audit's secret)"),
    device: str = DEVICE,
    overwrite: bool = OVERWRITE,
) -> None:
    """Audit a route: an epsilon lower bound from canaries."""
    from dpdistill.audit.run import AuditConfig, run_audit
    from dpdistill.reporting.audit import audit_claim

    config = AuditConfig(dataset=dataset, method=method, canaries=canaries, epsilon=epsilon, delta=delta,
                         student_arch=student_arch, epochs=epochs, teachers=teachers, teacher_arch=teacher_arch,
                         preset=preset, settings=tuple(set_), inversion=inversion, shadows=shadows,
                         white_box=white_box, seed=seed, device=device)
    with progress_display(None, f"audit {method}") as update:
        report = run_audit(config, out, update, overwrite)
    result = report["audit"]
    summary.print(f"epsilon lower bound {result['epsilon_lower_bound']:.3g} at {100 * result['confidence']:g}% "
                  f"({result['right']} of {result['guesses_in'] + result['guesses_out']} guesses right, "
                  f"{result['canaries']} canaries) against {audit_claim(report['privacy'])}"
                  f"{': REFUTED' if report['refuted'] else ''} -> {out}")


def main() -> None:
    """The `dpdistill` command: its process is its own, so large tensors may reuse freed pages, not fresh maps
    (a program that imports the package keeps its C library's settings)."""
    keep_freed_memory()
    app(prog_name="dpdistill")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
