"""The README and the manual in docs/: every relative link and anchor resolves, every Python block runs offline as
written (or says it needs the Hugging Face Hub), and nothing a reader sees talks about how the project was built."""

import json
import os
import re
import subprocess
import sys
import unicodedata
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NEEDS_HUB_COMMENT = "<!-- needs-hub -->"
NEEDS_HUB_FIRST_LINE = "# needs the Hugging Face Hub"
# A block that reads what a command shown above it writes (a trained folder): a test of its own makes the files and
# runs it, so the offline run leaves it out.
RUNS_IN_A_TEST_COMMENT = "<!-- runs-in-a-test -->"

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`+[^`]*`+")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    lines, in_code = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if not in_code:
            lines.append((number, line))
    return lines


def heading_text(raw: str) -> str:
    """A heading's text as rendered: links keep their text, code and emphasis lose their markers."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    return re.sub(r"[`*]", "", text)


def mkdocs_slug(text: str) -> str:
    # Python-Markdown's toc.slugify, which mkdocs uses.
    value = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def github_slug(text: str) -> str:
    # GitHub keeps letters, digits, '_', '-' and spaces, and turns each space into '-' without collapsing runs.
    value = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return value.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Anchors a link may use: a heading's slug where mkdocs and GitHub agree on it."""
    found = set()
    for _, line in prose_lines(page.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if match:
            text = heading_text(match.group(2))
            if mkdocs_slug(text) == github_slug(text):
                found.add(mkdocs_slug(text))
    return found


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_links_and_anchors_resolve(page):
    broken = []
    for number, line in prose_lines(page.read_text(encoding="utf-8")):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            inside = os.path.normpath(page.parent / path).startswith(str(DOCS)) or page.parent != DOCS
            if not inside:
                broken.append(f"line {number}: {target}: outside docs/, which the site does not carry")
            elif not resolved.exists():
                broken.append(f"line {number}: {target}: no such file")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"line {number}: {target}: no heading with that anchor in {resolved.name}")
    assert not broken, f"{page_id(page)}:\n" + "\n".join(broken)


def test_docs_pages_are_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    missing = [page.name for page in PAGES[1:] if page.name not in nav]
    assert not missing, f"docs pages missing from mkdocs.yml's nav: {missing}"


def test_readme_is_a_landing_page():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    long_lines = [n for n, line in prose_lines(text) if len(line) > 120 and not line.lstrip().startswith("|")]
    assert not long_lines, f"README.md lines over 120 characters: {long_lines}"


def python_blocks(page: Path) -> list[tuple[int, str, bool]]:
    """(line number, code, needs the Hub) for each ```python block."""
    blocks, lines = [], page.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        if re.match(r"^```python\s*$", lines[index]):
            start, body = index + 1, []
            index += 1
            while not lines[index].startswith("```"):
                body.append(lines[index])
                index += 1
            before = next((line for line in reversed(lines[: start - 1]) if line.strip()), "")
            needs_hub = before.strip() == NEEDS_HUB_COMMENT or (body and body[0].strip() == NEEDS_HUB_FIRST_LINE)
            needs_hub = needs_hub or before.strip() == RUNS_IN_A_TEST_COMMENT
            blocks.append((start + 1, "\n".join(body) + "\n", needs_hub))
        index += 1
    return blocks


OFFLINE_BLOCKS = [
    pytest.param(page, number, code, id=f"{page_id(page)}:{number}")
    for page in PAGES
    for number, code, needs_hub in python_blocks(page)
    if not needs_hub
]


# Runs each block with its own globals in its own empty folder, in one interpreter: a block still needs every import
# it uses, and the blocks share only the cost of importing torch and transformers.
RUNNER = """
import json, os, sys, traceback
failures = {}
for name, folder, code in json.load(sys.stdin):
    os.chdir(folder)
    try:
        exec(compile(code, name, "exec"), {"__name__": "__main__"})
    except BaseException:
        failures[name] = traceback.format_exc(limit=-3)
print(json.dumps(failures))
"""


def test_python_blocks_run_offline(tmp_path):
    """Every block not marked as needing the Hub runs as written, in an empty folder, with the Hub switched off."""
    assert OFFLINE_BLOCKS, "no runnable Python block found: the README's quick start should be one"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    blocks = []
    for index, block in enumerate(OFFLINE_BLOCKS):
        page, number, code = block.values
        folder = tmp_path / str(index)
        folder.mkdir()
        blocks.append((f"{page_id(page)}, block at line {number}", str(folder), code))
    result = subprocess.run(
        [sys.executable, "-c", RUNNER], input=json.dumps(blocks), env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    failures = json.loads(result.stdout.strip().splitlines()[-1])
    assert not failures, "\n\n".join(f"{name}:\n{trace}" for name, trace in failures.items())


def test_every_python_block_runs_or_needs_the_hub():
    # A block is either in OFFLINE_BLOCKS (run above) or marked; this names the marked ones so a reader can check them.
    marked = [(page_id(p), n) for p in PAGES for n, _, hub in python_blocks(p) if hub]
    for page, number in marked:
        code = next(c for n, c, _ in python_blocks(ROOT / page) if n == number)
        assert re.search(r"from_pretrained\(|load_dataset\(|pipeline\(|CrossEncoder\(|Transformer\(", code), (
            f"{page}: the block at line {number} is marked as needing the Hub but loads nothing"
        )


# Written so that this file passes its own check: each pattern's source is not the phrase it matches.
BUILD_TALK = re.compile(
    r"\bissues? [0-9]{1,3}\b|\bwas lent\b|\blent to\b|\bworkplace\b|\bengineers'? jobs|\bminutes? (?:of )?budget"
    r"|\bdevice[- ]machines?\b|\bno GPU was (?:lent|available to this)",
    re.IGNORECASE,
)
READ_BY_USERS = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    *sorted(
        path
        for folder in ("docs", "models", "finetune", "conversion", "benchmarks", "tests")
        for path in (ROOT / folder).rglob("*")
        if path.suffix in (".py", ".md") and "__pycache__" not in path.parts
    ),
]


@pytest.mark.parametrize("path", READ_BY_USERS, ids=page_id)
def test_no_word_about_how_the_project_was_built(path):
    hits = [
        f"line {number}: {line.strip()}"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if BUILD_TALK.search(line)
    ]
    assert not hits, f"{page_id(path)} talks about how the project was built:\n" + "\n".join(hits)


def test_qa_page_opens_with_the_shipped_demo_data_and_the_extractive_pipeline(tmp_path, capsys, monkeypatch):
    """A question-answering user reads docs/qa.md first: its first section runs posformers-qa on the data installed
    with posformers and answers a question with the `extractive-question-answering` pipeline (transformers 5's
    `question-answering` is gone)."""
    import ast
    import shlex

    import torch
    import transformers

    from posformers import LittleBirdConfig, LittleBirdForQuestionAnswering
    from posformers.finetune.arguments import ModelArguments, RunArguments, parse_arguments
    from posformers.finetune.demo import DEMO_DATA
    from posformers.finetune.run_qa import QADataArguments

    page = DOCS / "qa.md"
    first = page.read_text(encoding="utf-8").split("\n## ")[1]
    assert first.startswith("First steps"), "the first section of qa.md is not the demo and the pipeline"
    assert 'pipeline("question-answering")' in first and '"extractive-question-answering"' in first
    (command,) = re.findall(r"```bash\n(.*?)```", first, re.S)
    setting, run = command.replace("\\\n", " ").strip().splitlines()
    assert setting == 'DEMO=$(python -c "from posformers.finetune.demo import DEMO_DATA; print(DEMO_DATA)")'
    words = shlex.split(run.replace("$DEMO", str(DEMO_DATA)))
    assert words[0] == "posformers-qa"
    named = [Path(word) for word in words if word.startswith(str(DEMO_DATA))]
    assert len(named) == 4 and all(path.exists() for path in named), named  # installed with the package
    model_args, data_args, _, training_args = parse_arguments(
        (ModelArguments, QADataArguments, RunArguments, transformers.TrainingArguments), words[1:]
    )
    assert (training_args.output_dir, Path(data_args.train_file)) == ("out/qa-demo", DEMO_DATA / "qa" / "train.json")

    # The pipeline block on a folder as the command writes it (untrained here: the block's code is what is tested).
    config = LittleBirdConfig.from_pretrained(model_args.config_name)
    torch.manual_seed(0)
    LittleBirdForQuestionAnswering(config).save_pretrained(tmp_path / training_args.output_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_args.tokenizer_name)
    tokenizer.save_pretrained(tmp_path / training_args.output_dir)
    ((number, code, _),) = [block for block in python_blocks(page) if "extractive-question-answering" in block[1]]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{page_id(page)}, block at line {number}", "exec"), {"__name__": "__main__"})
    answer = ast.literal_eval(capsys.readouterr().out.strip().splitlines()[-1])  # the dict the block prints
    assert set(answer) == {"score", "start", "end", "answer"} and answer["answer"]


def test_deploying_runs_the_folder_it_exported():
    """docs/deploying.md exports a model folder and then compares the exported graph with that same folder."""
    page = (DOCS / "deploying.md").read_text(encoding="utf-8")
    (exported,) = re.findall(r"^posformers-export onnx (\S+) ", page, re.M)
    blocks = [code for _, code, _ in python_blocks(DOCS / "deploying.md")]
    compared = {folder for code in blocks for folder in re.findall(r'from_pretrained\("([^"]+)"\)', code)}
    assert compared == {exported}, (exported, compared)


def test_glue_page_documents_custom_data_and_names_real_options():
    """docs/glue.md says how custom files become a task (text columns, regression labels, from a classifier, the
    predictions file), and every option it names is one posformers-glue takes."""
    import dataclasses

    from transformers import TrainingArguments

    from posformers.finetune.arguments import ModelArguments, RunArguments
    from posformers.finetune.run_glue import DataTrainingArguments

    page = (DOCS / "glue.md").read_text(encoding="utf-8")
    custom = page.split("- **Your own data**", 1)[1].split("\n- **", 1)[0]
    for told in ("--text_columns", "train a regression", "--ignore_mismatched_sizes", "predictions.tsv"):
        assert told in custom, told
    groups = (ModelArguments, DataTrainingArguments, RunArguments, TrainingArguments)
    options = {f"--{field.name}" for group in groups for field in dataclasses.fields(group)}
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9_]*", page))
    assert named <= options, sorted(named - options)


def test_roformer_page_tells_its_two_tokenizers_apart_and_how_they_decode():
    """docs/roformer.md: which tokenizer a vocabulary gets (as posformers-convert decides), what it needs, and that
    decoding spaces Chinese tokens apart, as a character-level tokenizer shows without rjieba."""
    from helpers.data import DATA_DIR
    from transformers import BertTokenizer

    from posformers.conversion.roformer import is_word_level

    page = (DOCS / "roformer.md").read_text(encoding="utf-8")
    section = page.split("\n## Tokenizers\n", 1)[1].split("\n## ", 1)[0]
    for told in ("rjieba", "RoFormerTokenizer", "BertTokenizer", "more than 100", "Decoding puts a space"):
        assert told in section, told
    words, characters = (
        DATA_DIR / "vocab" / name / "vocab.txt" for name in ("roformer-chinese-base", "bert-base-chinese")
    )
    assert is_word_level(words.read_text(encoding="utf-8").split("\n"))
    assert not is_word_level(characters.read_text(encoding="utf-8").split("\n"))
    tokenizer = BertTokenizer(str(characters))
    decoded = tokenizer.decode(tokenizer("今天天气非常好。")["input_ids"], skip_special_tokens=True)
    assert f"`{decoded}` (character-level)" in section


# ---------------------------------------------------------------------------------------------------------------------
# docs/development.md's "Adding a model" against the registries
# ---------------------------------------------------------------------------------------------------------------------

LISTED_PATH = re.compile(r"`((?:[\w.-]+/)*[\w<>-]+\.(?:py|md|yml))`( \(optional\))?")


def adding_a_model() -> dict[str, bool]:
    """The files the "Adding a model" section of docs/development.md names, `<name>` standing for the model's name:
    {path: whether it is marked "(optional)"}."""
    section = (DOCS / "development.md").read_text(encoding="utf-8").split("\n## Adding a model\n", 1)[1]
    return {path: bool(optional) for path, optional in LISTED_PATH.findall(section.split("\n## ", 1)[0])}


def package_models() -> list[str]:
    """The names of the package's models (`_MODELS` in models/__init__.py), from their configuration modules."""
    import posformers

    return [configuration.__name__.rsplit("configuration_", 1)[1] for configuration, _ in posformers._MODELS]


def model_names() -> list[str]:
    """The models of tests/helpers/registry.py, which are the package's."""
    from helpers.registry import REGISTRY

    assert sorted(package_models()) == sorted(REGISTRY), "tests/helpers/registry.py and models/__init__.py differ"
    return list(REGISTRY)


def registrations() -> dict[str, Callable[[str], bool]]:
    """Each file holding a table that every model joins, as {path: name -> whether the model is in it}; the path is
    that of the table's module, so that a table that moves is followed."""
    from helpers import registry, strategies

    import posformers
    from benchmarks import registry as benchmark_suites
    from posformers.conversion import cli
    from posformers.finetune import pretrain_rss
    from posformers.integrations import export, peft

    def model_type(name: str) -> str:
        return registry.REGISTRY[name].config_class.model_type

    def exportable(name: str) -> bool:
        try:
            export._check_exportable(registry.REGISTRY[name].build("AutoModel"))
        except ValueError:
            return False
        return True

    def has_span_selection(name: str) -> bool:
        try:
            pretrain_rss.span_selection_class(model_type(name))
        except pretrain_rss.ArgumentError:
            return False
        return True

    tables = {
        posformers: lambda name: name in package_models(),
        registry: lambda name: name in registry.REGISTRY,
        strategies: lambda name: name in strategies.STRATEGIES,
        peft: lambda name: model_type(name) in peft.TARGET_MODULES,
        export: exportable,
        pretrain_rss: has_span_selection,
        cli: lambda name: name in cli.FAMILIES,
        benchmark_suites: lambda name: name in benchmark_suites.SUITES,
    }
    found = {Path(module.__file__).resolve().relative_to(ROOT).as_posix(): holds for module, holds in tables.items()}
    found["mkdocs.yml"] = lambda name: f" {name}.md\n" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    found["README.md"] = lambda name: f"(docs/{name}.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
    return found


def test_adding_a_model_names_files_every_model_has():
    """Each file the list names exists, and each named after the model exists for every model unless marked
    optional."""
    names = model_names()
    missing = [
        path.replace("<name>", name)
        for path, optional in adding_a_model().items()
        for name in (names if "<name>" in path else [""])
        if not optional and not (ROOT / path.replace("<name>", name)).exists()
    ]
    assert not missing, f"the list of files in docs/development.md names files that do not exist: {missing}"


def test_adding_a_model_names_every_file_a_model_is_registered_in():
    """Every table every model joins (the package's models, the test registry, the property strategies, the
    integrations, conversion, benchmarks, the manual) holds every model and is named in the list, and so is every
    file of models/ named after a model (its kernels module, say)."""
    listed, names, tables = adding_a_model(), model_names(), registrations()
    unlisted = [path for path in tables if path not in listed]
    absent = {path: [name for name in names if not holds(name)] for path, holds in tables.items()}
    templates = [re.compile(re.escape(path).replace("<name>", "(?P<name>[a-z]+)")) for path in listed]
    unnamed = [
        path.relative_to(ROOT).as_posix()
        for name in names
        for path in sorted((ROOT / "models").glob(f"*{name}*.py"))
        if not any((m := t.fullmatch(path.relative_to(ROOT).as_posix())) and m["name"] == name for t in templates)
    ]
    assert not unlisted + unnamed, f"the list of files in docs/development.md misses {unlisted + unnamed}"
    assert not any(absent.values()), {path: names for path, names in absent.items() if names}
