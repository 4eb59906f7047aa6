#!/usr/bin/env python3
"""readme_paths.py - fails when README.md or a page under docs/ names a path that does not exist.

Usage: readme_paths.py SRCDIR [BUILDDIR]

The pages: README.md and every docs/**/*.md. Markdown links ([text](target), images too) are
checked first and then taken out of the line: a relative target must exist relative to the page's
folder (as a browser reads it), and a target's #anchor must be a heading of the page it names
(GitHub's anchors: lower case, punctuation but '-' and '_' dropped, spaces as '-'). In the rest,
every word that contains a '/' (prose, backticks, code blocks) is a candidate and is read from the
top of the tree (SRCDIR), whatever the page's folder. What counts, in this order:
  - skipped, not paths: URLs (anything with '://'), absolute paths (/usr/..., /tmp/...: the
    system's or created at run time), and words with characters a literal path here never has
    ($VAR/..., DIR/step-<N>, build*/..., owner/repo#123, OPT=/path);
  - output paths: a word that the top-level .gitignore ignores (build-release/..., data/mnist,
    examples/minimal/train) is created by a command, so it is not looked up in the source tree.
    A path in a build folder (build*/X) is looked up as X in BUILDDIR instead, since every meson
    build folder has the same layout; X under meson-logs/ is skipped (runs write it);
  - repository paths: a word whose first folder is a top-level entry of SRCDIR (scripts/, runtime/,
    models/ops/...) must exist under SRCDIR;
  - misspelt folders: any other word ending in a source-file suffix (.c, .h, .sh, .py, .md, ...)
    is reported too: it reads as a path but its first folder is not in the tree;
  - everything else (MB/s, bf16/fp16, SIGUSR1/SIGTERM, DIR/rank.N.out, runs/logs) is not a path
    of this repository.
Bare file names without a '/' (ddp.h, context.c) are not checked.
Commands: every `mpirun` command line (mpirun followed by an option) carries --allow-run-as-root, or
it fails as root, which is how the project's machines and many containers run it.
Run files: in the ddp-train and ddp-ckpt commands of all pages (a line ending in a backslash joined
to the next), every file under runs/ that a command reads (--init-from, --resume, export-llmc's
input) is written by some documented command (--save, --save-llmc, or a step-N checkpoint under a
--checkpoint-dir) of the same model, and no run folder or file is written by commands of two
models (--model; mlp by default; gpt2 for --init-from and export-llmc; a command with '...' in
it has an unknown model).
Lists: docs/running.md names every slurm/*.sbatch template, and every `--model A|B|...` on a page
lists ddp-train's models (train/train_opts.c's "model" row).
Prints every missing path with its page and line; exits 1 when there is one, 0 otherwise.
"""
import fnmatch
import os
import re
import sys

# A literal relative path: components of these characters, separated by '/'.
PATH_RE = re.compile(r"(?:\./)?[\w.+-]+(?:/[\w.+-]+)*/?")
# Candidates: maximal runs without spaces, backticks, brackets, quotes or separators.
WORD_RE = re.compile(r"[^\s`()\[\]{}|,;:\"']*/[^\s`()\[\]{}|,;:\"']*")
# An mpirun command line (not the word in prose): mpirun followed by one of its options.
MPIRUN_RE = re.compile(r"\bmpirun\s+-")
# A Markdown link or image, [text](target) or ![alt](target): the target is group 1.
LINK_RE = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING_RE = re.compile(r"#{1,6}\s+(.*?)\s*#*\s*$")
SOURCE_SUFFIXES = (".c", ".h", ".cu", ".cuh", ".sh", ".py", ".js", ".md", ".sbatch", ".build",
                   ".txt", ".png", ".supp", ".json")


def read_ignores(srcdir):
    """Return the patterns of SRCDIR/.gitignore (comments and blank lines dropped)."""
    path = os.path.join(srcdir, ".gitignore")
    if not os.path.exists(path):
        return []
    patterns = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("!"):
                sys.exit(f"readme_paths: .gitignore negation '{line}' is not supported here")
            patterns.append(line)
    return patterns


def ignored(parts, patterns):
    """True when the path PARTS (a list of components) or a folder above it matches a pattern."""
    for pat in patterns:
        body = pat.strip("/")
        anchored = "/" in body or pat.startswith("/")
        for n in range(1, len(parts) + 1):
            if anchored and fnmatch.fnmatchcase("/".join(parts[:n]), body):
                return True
            if not anchored and fnmatch.fnmatchcase(parts[n - 1], body):
                return True
    return False


def candidates(line):
    """Yield every word of LINE (links already taken out) that contains a '/'."""
    for m in WORD_RE.finditer(line):
        yield m.group(0).rstrip(".")


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    """The anchors of the headings of the Markdown file PATH (outside code blocks)."""
    found, in_code = set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                in_code = not in_code
            elif not in_code and HEADING_RE.match(line):
                found.add(slug(HEADING_RE.match(line).group(1)))
    return found


def check_link(target, page):
    """None when the link TARGET of PAGE resolves, else why not."""
    if "://" in target or target.startswith("mailto:"):
        return None
    path, _, anchor = target.partition("#")
    full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
    if not os.path.exists(full):
        return "no such file"
    if anchor and full.endswith(".md") and anchor not in anchors(full):
        return f"no heading with anchor #{anchor}"
    return None


def classify(word, srcdir, builddir, top, patterns):
    """Return (kind, path to look up or None); kind is skip, build, repo or misspelt."""
    if "://" in word or word.startswith("/") or not PATH_RE.fullmatch(word):
        return "skip", None
    parts = [p for p in word.split("/") if p and p != "."]
    if not parts:
        return "skip", None
    if ignored(parts, patterns):
        if not fnmatch.fnmatchcase(parts[0], "build*") or builddir is None:
            return "skip", None
        if len(parts) == 1 or parts[1] == "meson-logs":
            return "skip", None
        return "build", os.path.join(builddir, *parts[1:])
    if parts[0] in top:
        return "repo", os.path.join(srcdir, *parts)
    if parts[-1].endswith(SOURCE_SUFFIXES):
        return "misspelt", None
    return "skip", None


def pages(srcdir):
    """README.md and every docs/**/*.md under SRCDIR, sorted."""
    found = [os.path.join(srcdir, "README.md")]
    for root, _, files in os.walk(os.path.join(srcdir, "docs")):
        found += [os.path.join(root, f) for f in files if f.endswith(".md")]
    return sorted(found)


def check_page(page, srcdir, builddir, top, patterns, counts):
    """Return the problems of one page (a list of lines to print); COUNTS is updated."""
    name = os.path.relpath(page, srcdir)
    missing = []
    with open(page, encoding="utf-8") as f:
        text = f.read()
    for lineno, line in enumerate(text.splitlines(), 1):
        for m in LINK_RE.finditer(line):
            counts["link"] += 1
            why = check_link(m.group(1), page)
            if why:
                missing.append(f"{name}:{lineno}: link {m.group(1)} ({why})")
        if MPIRUN_RE.search(line) and "--allow-run-as-root" not in line:
            counts["mpirun"] += 1
            missing.append(f"{name}:{lineno}: an mpirun command without --allow-run-as-root (fails as root)")
        elif MPIRUN_RE.search(line):
            counts["mpirun"] += 1
        seen = set()
        for word in candidates(LINK_RE.sub(" ", line)):
            kind, path = classify(word, srcdir, builddir, top, patterns)
            if kind == "skip" or word in seen:
                continue
            seen.add(word)
            if kind == "misspelt":
                missing.append(f"{name}:{lineno}: {word} (its first folder is not in the tree)")
                continue
            counts[kind] += 1
            if not os.path.exists(path):
                where = "in the build folder" if kind == "build" else "in the source tree"
                missing.append(f"{name}:{lineno}: {word} (not {where})")
    return missing


READS = ("--init-from", "--resume", "export-llmc")
WRITES = ("--save", "--save-llmc", "--checkpoint-dir")
CKPT_RE = re.compile(r"step-\d{12}(\.ckpt)?/?$")  # what a --checkpoint-dir holds


def commands(page):
    """The ddp-train and ddp-ckpt command lines of a page (continuations joined), as word lists."""
    with open(page, encoding="utf-8") as f:
        text = re.sub(r"\\\n\s*", " ", f.read())
    return [line.replace("`", " ").split() for line in text.splitlines()
            if re.search(r"\bddp-(train|ckpt)\b", line)]


def command_model(words):
    """The model a command trains or reads: --model's, gpt2 for export-llmc and --init-from
    (GPT-2 only), mlp (the default) for ddp-train, None when unknown ('...' in it)."""
    for flag, value in zip(words, words[1:]):
        if flag == "--model":
            return value
    if "export-llmc" in words or "--init-from" in words:
        return "gpt2"
    return None if "..." in words or "ddp-ckpt" in " ".join(words) else "mlp"


def run_io(all_pages, srcdir):
    """The runs/ paths the commands read, [(page, path, model)], and write, {path: {(page, model,
    is_folder)}}."""
    reads, writes = [], {}
    for page in all_pages:
        name = os.path.relpath(page, srcdir)
        for words in commands(page):
            model = command_model(words)
            for flag, value in zip(words, words[1:]):
                if value.startswith("runs/") and flag in READS:
                    reads.append((name, value, model))
                elif value.startswith("runs/") and flag in WRITES:
                    writes.setdefault(value.rstrip("/"), set()).add(
                        (name, model, flag == "--checkpoint-dir"))
    return reads, writes


def writer_models(path, writes):
    """The models of the commands that write path (None: none writes it)."""
    for out, users in writes.items():
        folder = any(f for _, _, f in users)
        rest = path[len(out) + 1:] if path.startswith(out + "/") else None
        if path == out or (folder and rest is not None and CKPT_RE.match(rest)):
            return {m for _, m, _ in users}
    return None


def run_files(all_pages, srcdir):
    """The problems of the run files (see the module's text) over all pages."""
    reads, writes = run_io(all_pages, srcdir)
    problems = []
    for out, users in writes.items():
        models = {m for _, m, _ in users if m}
        if len(models) > 1:
            problems.append(f"{out}: written by commands of {sorted(models)} in "
                            f"{sorted({n for n, _, _ in users})}: give each example its own folder")
    for name, path, model in reads:
        models = writer_models(path, writes)
        if models is None:
            problems.append(f"{name}: {path} is read, but no documented command writes it")
        elif model and models - {None} and model not in models:
            problems.append(f"{name}: {path} is read as a {model} run, but the documented "
                            f"commands that write it train {sorted(models - {None})}")
    return problems


def lists(all_pages, srcdir):
    """The problems of the lists (see the module's text)."""
    problems = []
    with open(os.path.join(srcdir, "docs", "running.md"), encoding="utf-8") as f:
        running = f.read()
    for t in sorted(os.listdir(os.path.join(srcdir, "slurm"))):
        if t.endswith(".sbatch") and f"slurm/{t}" not in running:
            problems.append(f"docs/running.md: the template slurm/{t} is not named")
    with open(os.path.join(srcdir, "train", "train_opts.c"), encoding="utf-8") as f:
        models = re.search(r'\{"model", "([\w|]+)"', f.read()).group(1)
    for page in all_pages:
        with open(page, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                for got in re.findall(r"--model ([a-z0-9]+(?:\|[a-z0-9]+)+)", line):
                    if got != models:
                        problems.append(f"{os.path.relpath(page, srcdir)}:{lineno}: --model {got}, "
                                        f"but ddp-train's models are {models}")
    return problems


def main(argv):
    if len(argv) not in (2, 3):
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    srcdir = argv[1]
    builddir = argv[2] if len(argv) == 3 else None
    top = {e for e in os.listdir(srcdir) if not e.startswith(".")}
    patterns = read_ignores(srcdir)
    counts = {"repo": 0, "build": 0, "link": 0, "mpirun": 0}
    all_pages = pages(srcdir)
    missing = []
    for page in all_pages:
        missing += check_page(page, srcdir, builddir, top, patterns, counts)
    missing += run_files(all_pages, srcdir) + lists(all_pages, srcdir)
    for m in missing:
        print(m)
    print(f"readme_paths: {len(all_pages)} pages; {counts['repo']} source paths, {counts['build']} build "
          f"paths, {counts['link']} links and {counts['mpirun']} mpirun commands checked, {len(missing)} problems")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
