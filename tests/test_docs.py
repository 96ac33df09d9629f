"""The README and docs/ stay true to the tree: links and anchors resolve, every config group is documented, the
README's test command is what CI runs, and the paths, modules and make targets the docs name exist.

Plain file reads (no imports of fusebench, no subprocesses): part of the fast tier.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
SRC = ROOT / "src"
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]+`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
# a path or module named with a placeholder or a pattern is not one file (conf/fusion/NAME.yaml, DIR/models/)
PLACEHOLDER = re.compile(r"[A-Z]{3,}|[*{}<>]|\.\.\.")


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans (where Markdown renders links)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def code_spans(text: str) -> list[str]:
    """Inline code spans and the lines of fenced blocks: where the docs name files, modules and commands."""
    spans = [span[1:-1] for span in INLINE_CODE.findall(FENCE.sub("", text))]
    return spans + [line for block in FENCE.finditer(text) for line in block.group(0).splitlines()[1:-1]]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (but - and _), spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        n = counts.get(base, 0)
        counts[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[str]:
    return [target for target in LINK.findall(prose(path.read_text(encoding="utf-8")))
            if not re.match(r"[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: are not checked here


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_relative_links_and_anchors_resolve(page):
    broken = []
    for target in links(page):
        file_part, _, anchor = target.partition("#")
        resolved = (page.parent / file_part).resolve() if file_part else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif not resolved.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
            broken.append(f"{target}: no heading with anchor #{anchor} in {page_id(resolved)}")
    assert not broken, f"{page_id(page)}: " + "; ".join(broken)


def test_docs_exist_and_the_index_maps_every_page():
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    assert "index.md" in pages and "config.md" in pages
    linked = {Path(target.partition("#")[0]).name for target in links(DOCS / "index.md")}
    assert not set(pages) - linked - {"index.md"}, "docs/index.md does not link these pages"
    readme = {target.partition("#")[0] for target in links(ROOT / "README.md")}
    assert "docs/index.md" in readme, "the README links the docs' map"


def config_groups() -> list[str]:
    """Every folder of conf/ that holds options (YAML files), as Hydra names the group: dataset, hydra/sweeper."""
    conf = ROOT / "conf"
    return sorted({str(p.parent.relative_to(conf).as_posix()) for p in conf.rglob("*.yaml") if p.parent != conf})


def test_every_config_group_is_in_docs_config():
    text = (DOCS / "config.md").read_text(encoding="utf-8")
    groups = config_groups()
    assert "dataset" in groups and "fusion" in groups
    missing = [group for group in groups if f"`{group}`" not in text]
    assert not missing, f"docs/config.md does not describe config group(s) {missing}"


def test_every_option_but_models_is_named_in_docs():
    """Options are named somewhere in docs/ (a new fusion preset, experiment or dataset is documented). Models are
    data, listed by fusebench-models: a new model YAML needs no doc change."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in DOCS.glob("*.md"))
    conf = ROOT / "conf"
    missing = [f"{group}={path.stem}" for group in config_groups() if group != "models"
               for path in sorted((conf / group).glob("*.yaml")) if f"`{path.stem}`" not in text
               and not re.search(rf"`[^`\n]*\b{re.escape(path.stem)}\b[^`\n]*`", text)]
    assert not missing, f"options not named in docs/: {missing}"


def quickstart(text: str) -> str:
    match = re.search(r"^## Quickstart\n(.*?)(?=^## )", text, re.M | re.S)
    assert match, "README.md has a Quickstart section"
    return match.group(1)


def test_readme_test_command_is_what_ci_runs():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line.strip() and not line.lstrip().startswith(("#", "set ", "cd "))]
    assert ci == ["make test"], f".ci/run runs {ci}: update the README's Quickstart and this test together"
    blocks = [m.group(0) for m in FENCE.finditer(quickstart((ROOT / "README.md").read_text(encoding="utf-8")))]
    commands = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()[1:-1]]
    assert "make run" in commands and ci[0] in commands


def test_make_targets_named_in_docs_exist():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M))
    named = {(page_id(page), m) for page in PAGES for span in code_spans(page.read_text(encoding="utf-8"))
             for m in re.findall(r"(?<![\w/.-])make ([a-z][\w-]*)", span)}
    missing = sorted(f"{where}: make {target}" for where, target in named if target not in targets)
    assert not missing, missing


REPO_PATH = re.compile(r"(?<![\w./-])((?:src|conf|tests|scripts|notebooks|docs|\.ci)/[\w./*{},-]*)")


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_repository_paths_named_in_docs_exist(page):
    missing = []
    for span in code_spans(page.read_text(encoding="utf-8")):
        for path in REPO_PATH.findall(span):
            path = path.rstrip(".")
            if PLACEHOLDER.search(path):
                continue
            if not (ROOT / path).exists():
                missing.append(path)
    assert not missing, f"{page_id(page)} names paths that do not exist: {sorted(set(missing))}"


MODULE = re.compile(r"(?<![\w.])fusebench(?:\.\w+)+")
NOT_MODULES = (".log", ".json", ".yaml", ".md", ".py", ".txt")  # fusebench.log is a run dir's file


def resolves(name: str) -> bool:
    """``fusebench.a.b[.attr]`` names a package or module under src/ (``fusebench.conf`` is conf/, shipped as that
    package), optionally followed by a name its module defines or imports at top level."""
    parts = name.split(".")
    if parts[:2] == ["fusebench", "conf"]:
        return len(parts) == 2
    here = SRC / "fusebench"
    module = here / "__init__.py"
    for i, part in enumerate(parts[1:], start=1):
        if (here / part / "__init__.py").is_file():
            here, module = here / part, here / part / "__init__.py"
        elif (here / f"{part}.py").is_file():
            module, rest = here / f"{part}.py", parts[i + 1:]
            return len(rest) <= 2 and (not rest or defines(module, rest[0]))
        else:
            rest = parts[i:]
            return len(rest) <= 2 and defines(module, rest[0])
    return True


def defines(module: Path, name: str) -> bool:
    text = module.read_text(encoding="utf-8")
    forwarded = re.search(r"^API\s*=\s*\(([^)]*)\)", text, re.M)  # names a module's __getattr__ imports on first use
    if forwarded and f'"{name}"' in forwarded.group(1):
        return True
    return bool(re.search(rf"^(?:(?:async\s+)?def|class)\s+{name}\b|^{name}\s*[:=]|^\s*(?:from\s+\S+\s+)?import\s+"
                          rf"[^\n]*\b{name}\b", text, re.M))


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_module_names_in_docs_resolve(page):
    names = {m for span in code_spans(page.read_text(encoding="utf-8")) for m in MODULE.findall(span)
             if not m.endswith(NOT_MODULES)}
    broken = sorted(name for name in names if not resolves(name))
    assert not broken, f"{page_id(page)} names modules or attributes that do not exist: {broken}"


CONF = ROOT / "conf"
SRC_PATH = re.compile(r"(?<![\w/])fusebench/[\w/]+\.py\b")
CLASS_NAME = re.compile(r"\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)*(?:Config|Schema|Record|Summary)\b")
NAMED_IN = re.compile(r"\b([A-Z]\w+) in (fusebench/[\w/]+\.py)\b")


def defined_classes() -> set[str]:
    return {m for p in SRC.rglob("*.py") for m in re.findall(r"^class\s+(\w+)", p.read_text(encoding="utf-8"), re.M)}


def test_config_file_comments_name_files_and_classes_that_exist():
    """Every source file, class and module a YAML comment names exists (and 'X in fusebench/a.py' is there)."""
    classes, broken = defined_classes(), []
    for path in sorted(CONF.rglob("*.yaml")):
        comments = "\n".join(line.split("#", 1)[1] for line in path.read_text(encoding="utf-8").splitlines()
                             if "#" in line)
        where = str(path.relative_to(ROOT))
        broken += [f"{where}: {p}" for p in SRC_PATH.findall(comments) if not (SRC / p).is_file()]
        broken += [f"{where}: {c}" for c in CLASS_NAME.findall(comments) if c not in classes]
        broken += [f"{where}: {name} in {p}" for name, p in NAMED_IN.findall(comments)
                   if (SRC / p).is_file() and not defines(SRC / p, name)]
        broken += [f"{where}: {m}" for m in MODULE.findall(comments) if not m.endswith(NOT_MODULES)
                   and not resolves(m)]
    assert not broken, f"config comments name what does not exist: {broken}"


def test_readme_names_every_extra_pyproject_has():
    """The README's list of extras is pyproject's: every extra named there exists, and every extra exists there."""
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
                 ["optional-dependencies"])
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`\[([\w-]+)\]`", readme))
    assert named <= extras, f"README names extras pyproject.toml lacks: {sorted(named - extras)}"
    assert extras <= named, f"README does not name the extras {sorted(extras - named)}"


# Module names two packages share: the same job for different stages, each said here (issue 30: names that
# explain themselves). A new shared name fails test_layout_names_every_module until it is added with its reason.
SHARED_NAMES = {
    "base.py": "a contract: encoders/ (a model backend) and backends/ (a search backend)",
    "cli.py": "a command: app/ (fusebench) and report/ (fusebench-report)",
    "simulated.py": "the simulator: data/ (the sim corpus) and encoders/ (the sim models' embeddings)",
}


PLUGIN_FOLDERS = ("methods", "kinds", "plots")  # plugin folders: layout.md names the folder, its registry lists the modules


def test_layout_names_every_module_and_shared_names_are_explained():
    """docs/layout.md names every module of the package (a plugin folder's modules, named by what they register:
    fusion methods, dataset kinds, model kinds, plots, as their folder; what a folder's plugins share, a module
    starting with _, by name), and a module name two packages share is one the table above explains."""
    package = SRC / "fusebench"
    layout = (DOCS / "layout.md").read_text(encoding="utf-8")
    named = {name.rsplit("/", 1)[-1] for name in re.findall(r"`([\w/]+\.py)`", layout)}
    modules = [p for p in package.rglob("*.py") if p.name != "__init__.py"
               and not (p.parent.name in PLUGIN_FOLDERS and not p.name.startswith("_"))]
    missing = sorted(str(p.relative_to(package)) for p in modules if p.name not in named)
    assert not missing, f"docs/layout.md does not name {missing}"
    by_name: dict[str, list[str]] = {}
    for path in modules:
        by_name.setdefault(path.name, []).append(path.parent.name)
    shared = {name for name, owners in by_name.items() if len(owners) > 1}
    assert shared == set(SHARED_NAMES), (f"modules of one name in two packages: {sorted(shared - set(SHARED_NAMES))} "
                                         f"(say why in SHARED_NAMES or rename); no longer shared: "
                                         f"{sorted(set(SHARED_NAMES) - shared)}")


def test_the_shard_key_is_described_in_the_same_words_by_both_pages():
    """Issue 39 item 8: galleries.md and stores.md once disagreed on what a gallery shard's key holds; both now
    carry one paragraph (what the key holds, what a rerun checks, what ``fusebench-cache verify`` finds), word for
    word."""
    start = "**What a gallery shard's key holds"

    def paragraph(name: str) -> str:
        text = (DOCS / name).read_text(encoding="utf-8")
        assert text.count(start) == 1, f"{name} must carry the shard key paragraph once"
        return text[text.index(start):].split("\n\n", 1)[0]

    assert paragraph("galleries.md") == paragraph("stores.md")
    assert "same size and the same mtime" in paragraph("stores.md") and "fusebench-cache verify" in paragraph("stores.md")
