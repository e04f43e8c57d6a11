#!/usr/bin/env python3
"""The shell commands of the documentation, as the docs tests read them.

The documents are README.md, docs/*.md and bench/README.md. A fenced block whose language is
sh, bash, shell or console holds commands a user would type, and its info string says
whether a test runs them:

    ```sh run                 run by tests/integration/test_docs_commands.sh
    ```sh norun=REASON        not run, for one of the REASONS below; counted

In a `run` block, each command (continued over lines by a trailing backslash, an open quote
or a here-document, as the shell reads it) may be followed by lines that say what to check;
being comments, they do nothing when a reader pastes the block:

    # expect: TEXT            the command's output (stdout and stderr) contains TEXT
    # expect-exit: N          the command exits N (default 0)

Every command needs at least one `# expect:`. A command that prints nothing by design (one
that writes a file, `mkdir`) says `# expect-exit: 0` instead, and one that ends with `&` runs
in the background and needs neither (later commands show its effect). A block runs in the order of its document,
in one shell per document, so a later block may use what an earlier one made.

Subcommands (each prints one line per problem and exits 1 on any):
    lint SRC                  check the tags, the expectations and the shell syntax of every
                              block
    links SRC                 every relative link of the documents (and proto/*.md,
                              quant/job/*.md) names an existing file, and every #anchor a
                              heading of its document
    style SRC                 README.md at most 200 lines; no development history (issue
                              numbers, sessions, "found by these tests"), no table cell over
                              600 characters
    blocks SRC                print every block as JSON
    norun-words SRC           print each command line of the blocks not run, with its first
                              two words (test_docs_commands checks that they exist)
    script SRC DOC WORLD PORT HTTP_PORT OUT
                              write the bash script that runs DOC's `run` blocks in WORLD
"""
import json
import os
import re
import subprocess
import sys

REASONS = {
    "setup": "the set-up and test commands: test_readme_commands runs them from a fresh clone",
    "gpu": "needs an NVIDIA GPU",
    "vllm": "needs vLLM",
    "install": "installs or changes the system (root, systemd, cmake --install)",
    "python": "needs Python packages from PyPI",
    "long": "takes minutes to hours, or gigabytes",
    "interactive": "runs until interrupted",
    "synopsis": "usage forms with placeholders (job.json, ID); each program and subcommand must run in some `run` block",
}
SHELL_LANGS = {"sh", "bash", "shell", "console"}
FENCE = re.compile(r"^(```+)\s*(.*)$")


def documents(src):
    """The documents, relative to SRC, in a fixed order."""
    out = ["README.md"]
    docs = os.path.join(src, "docs")
    if os.path.isdir(docs):
        out += sorted("docs/" + f for f in os.listdir(docs) if f.endswith(".md"))
    if os.path.exists(os.path.join(src, "bench", "README.md")):
        out.append("bench/README.md")
    return out


def fenced_blocks(path):
    """Yields (first line number, fence info, list of lines) for each fenced block."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group(1), m.group(2).strip(), i + 1
        body = []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        yield start, info, body
        i += 1


def shell_complete(text):
    """Whether TEXT is one or more whole shell commands (no open quote, continuation or
    here-document), as bash -n sees it."""
    if text.rstrip().endswith("\\"):
        return False
    r = subprocess.run(["bash", "-n"], input=text + "\n", capture_output=True, text=True)
    return r.returncode == 0 and "here-document" not in r.stderr


def split_commands(body, first_line):
    """The commands of a `run` block: dicts with line, text, expect, exit, background."""
    cmds, problems = [], []
    i = 0
    while i < len(body):
        line = body[i]
        s = line.strip()
        if not s:
            i += 1
            continue
        if s.startswith("#"):
            m = re.match(r"#\s*expect(-exit)?:\s?(.*)$", s)
            if m and not cmds:
                problems.append((first_line + i, "an expectation before any command"))
            elif m and m.group(1):
                try:
                    cmds[-1]["exit"] = int(m.group(2).strip())
                    cmds[-1]["exit_given"] = True
                except ValueError:
                    problems.append((first_line + i, "expect-exit needs a number"))
            elif m:
                if not m.group(2).strip():
                    problems.append((first_line + i, "an empty expectation"))
                cmds[-1]["expect"].append(m.group(2).strip())
            i += 1
            continue
        start, text = i, line
        while not shell_complete(text) and i + 1 < len(body):
            i += 1
            text += "\n" + body[i]
        if not shell_complete(text):
            problems.append((first_line + start, "a command that does not end (quote, backslash or here-document)"))
        stripped = re.sub(r"\s+#[^'\"]*$", "", text.split("\n")[-1]).rstrip()
        background = stripped.endswith("&") and not stripped.endswith("&&")
        cmds.append({"line": first_line + start, "text": text, "expect": [], "exit": 0,
                     "exit_given": False, "background": background})
        i += 1
    for c in cmds:
        if not c["expect"] and not c["exit_given"] and not c["background"]:
            problems.append((c["line"], "a `run` command without `# expect: TEXT` (or, for one that prints nothing, `# expect-exit: 0`)"))
        if c["background"] and (c["expect"] or c["exit_given"]):
            problems.append((c["line"], "a background command cannot have expectations"))
    return cmds, problems


def read_blocks(src):
    """Every shell block of every document, with its commands, and the problems found."""
    blocks, problems = [], []
    for doc in documents(src):
        for line, info, body in fenced_blocks(os.path.join(src, doc)):
            words = info.split()
            if not words or words[0] not in SHELL_LANGS:
                continue
            tags = words[1:]
            b = {"doc": doc, "line": line, "lang": words[0], "run": False, "reason": None,
                 "commands": [], "body": body}
            where = f"{doc}:{line}"
            if tags == ["run"]:
                b["run"] = True
                b["commands"], probs = split_commands(body, line + 1)
                problems += [(f"{doc}:{n}", p) for n, p in probs]
            elif len(tags) == 1 and tags[0].startswith("norun="):
                b["reason"] = tags[0][len("norun="):]
                if b["reason"] not in REASONS:
                    problems.append((where, f"unknown reason '{b['reason']}' (one of {', '.join(sorted(REASONS))})"))
                r = subprocess.run(["bash", "-n"], input="\n".join(body) + "\n", capture_output=True, text=True)
                if r.returncode:
                    problems.append((where, "shell syntax: " + r.stderr.strip().replace("\n", "; ")))
            else:
                problems.append((where, f"a ```{words[0]} block must say `run` or `norun=REASON` (got '{info}')"))
            blocks.append(b)
    # A synopsis stands for commands that do run elsewhere: its first two words must start
    # a command of some run block.
    ran = {tuple(c["text"].split()[:2]) for b in blocks if b["run"] for c in b["commands"]}
    for b in blocks:
        if b["reason"] != "synopsis":
            continue
        for i, line in enumerate(b["body"]):
            w = tuple(line.split("#", 1)[0].split()[:2])
            if w and w not in ran:
                problems.append((f"{b['doc']}:{b['line'] + 1 + i}", f"'{' '.join(w)}' in a synopsis, but in no `run` block"))
    return blocks, problems


def rewrite(text, world, port, http_port, build):
    """The command as the test runs it: the documents' paths and ports mapped into the
    test's world. /srv/ and /tmp/ are directories of WORLD, 127.0.0.1:6379 is the test's
    redis-server, 127.0.0.1:8080 its HTTP port, build/release the build under test."""
    text = re.sub(r"(?<![\w.~/-])/(srv|tmp)(?=[/\s'\"]|$)", lambda m: f"{world}/{m.group(1)}", text)
    text = re.sub(r"(?<![\w.-])(127\.0\.0\.1|localhost):6379\b", f"127.0.0.1:{port}", text)
    text = re.sub(r"(?<![\w.-])(127\.0\.0\.1|localhost):8080\b", f"127.0.0.1:{http_port}", text)
    text = re.sub(r"(?<![\w./-])build/release\b", build, text)
    return text


def shq(s):
    return "'" + s.replace("'", "'\\''") + "'"


def script(src, doc, world, port, http_port, out):
    """The bash script that runs DOC's `run` blocks. Per command N: its output in OUT/N.log
    and one line in OUT/results, `ok N WHERE` or `FAIL N WHERE: why`; OUT/current names
    the command running, and says `done` at the end."""
    blocks, _ = read_blocks(src)
    build = os.environ.get("QUANTD_BUILD_DIR", "build/release")
    lines = [
        "# generated by tests/docs_blocks.py: the run blocks of " + doc,
        f"cd {shq(src)}",
        f"redis-cli() {{ command redis-cli -p {port} \"$@\"; }}",
        f"export QUANTD_REDIS=redis://127.0.0.1:{port}",
        f"__out={shq(out)}",
        "__bg=()",
        "__check() {  # N WHERE RC WANT_RC EXPECT...",
        "  local n=$1 where=$2 rc=$3 want=$4; shift 4",
        "  local why=",
        "  [ \"$rc\" = \"$want\" ] || why=\"exit $rc, expected $want\"",
        "  for e in \"$@\"; do grep -qF -- \"$e\" \"$__out/$n.log\" || why=\"${why:+$why; }no '$e' in its output\"; done",
        "  if [ -z \"$why\" ]; then echo \"ok $n $where\" >>\"$__out/results\";",
        "  else echo \"FAIL $n $where: $why\" >>\"$__out/results\"; fi",
        "}",
    ]
    n = 0
    for b in blocks:
        if b["doc"] != doc or not b["run"]:
            continue
        for c in b["commands"]:
            n += 1
            where = f"{doc}:{c['line']}"
            text = rewrite(c["text"], world, port, http_port, build)
            lines.append(f"echo {shq(where)} >\"$__out/current\"")
            lines.append(f"printf '%s\\n' {shq('$ ' + c['text'])} >\"$__out/{n}.log\"")
            if c["background"]:
                lines.append("{\n" + text + "\n} >>\"$__out/%d.log\" 2>&1 </dev/null" % n)
                lines.append("__bg+=($!)")
                lines.append(f"echo {shq(f'ok {n} {where} (background)')} >>\"$__out/results\"")
            else:
                lines.append("{\n" + text + "\n} >>\"$__out/%d.log\" 2>&1 </dev/null" % n)
                tag = where if c["expect"] else where + " (exit status only)"
                lines.append(f"__check {n} {shq(tag)} $? {c['exit']} " + " ".join(shq(e) for e in c["expect"]))
    lines.append("echo done >\"$__out/current\"")
    lines.append("for p in \"${__bg[@]}\"; do kill -TERM \"$p\" 2>/dev/null; done")
    lines.append("for p in \"${__bg[@]}\"; do for _ in $(seq 100); do kill -0 \"$p\" 2>/dev/null || break; sleep 0.1; done; kill -9 \"$p\" 2>/dev/null; done")
    lines.append("exit 0")
    return "\n".join(lines) + "\n", n


# ---- links and style -------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    h = heading.strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def prose_lines(path):
    """(line number, text) of the lines outside fenced blocks, code spans blanked."""
    out, fence = [], None
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f.read().split("\n"), 1):
            m = FENCE.match(line)
            if m and fence is None:
                fence = m.group(1)
                continue
            if fence is not None:
                if line.startswith(fence):
                    fence = None
                continue
            out.append((n, re.sub(r"`[^`]*`", "``", line)))
    return out


def heading_slugs(path):
    slugs, counts = set(), {}
    fence = None
    with open(path, encoding="utf-8") as f:
        for line in f.read().split("\n"):
            m = FENCE.match(line)
            if m and fence is None:
                fence = m.group(1)
                continue
            if fence is not None:
                if line.startswith(fence):
                    fence = None
                continue
            h = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not h:
                continue
            s = slug(h.group(1))
            k = counts.get(s, 0)
            counts[s] = k + 1
            slugs.add(s if k == 0 else f"{s}-{k}")
    return slugs


def link_documents(src):
    """The documents and the developer notes beside the code (proto/*.md, quant/job/*.md)."""
    docs = documents(src)
    for folder in ("proto", "quant/job"):
        d = os.path.join(src, folder)
        if os.path.isdir(d):
            docs += sorted(folder + "/" + f for f in os.listdir(d) if f.endswith(".md"))
    return docs


def check_links(src):
    """Every relative link of the documents names a file or folder of the tree, and every
    #anchor a heading of its document."""
    problems = []
    for doc in link_documents(src):
        path = os.path.join(src, doc)
        for n, line in prose_lines(path):
            for m in LINK.finditer(line):
                target = m.group(2)
                if re.match(r"^[a-z]+:", target):
                    continue
                file_part, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
                if not os.path.exists(dest):
                    problems.append((f"{doc}:{n}", f"link to {target}: no such file"))
                    continue
                if anchor and dest.endswith(".md") and anchor not in heading_slugs(dest):
                    problems.append((f"{doc}:{n}", f"link to {target}: no heading with that anchor"))
    return problems


NOTEBOOK = [
    (re.compile(r"(?<![\w&])#\d+\b"), "an issue number: history belongs in git log"),
    (re.compile(r"\b[Ss]ession \d+"), "a development session: history belongs in git log"),
    (re.compile(r"\b[Rr]ound \d+ of\b|\bdevelopment round"), "a development round: history belongs in git log"),
    (re.compile(r"[Ff]ound by these tests"), "a fix history: it belongs in git log"),
]
MAX_CELL = 600   # about six lines of a rendered table: past that, split the row or move the prose out
# docs/architecture.md is the contributors' map of the code: its module table holds a
# folder's files per row and changes with the code, so the cell limit is for the user
# documentation only.
CELL_LIMIT_EXEMPT = {"docs/architecture.md"}


def check_style(src):
    """README.md at most 200 lines; no lab-notebook history in the documentation, and no
    table cell over MAX_CELL characters in the user documentation."""
    problems = []
    with open(os.path.join(src, "README.md"), encoding="utf-8") as f:
        n = len(f.read().splitlines())
    if n > 200:
        problems.append(("README.md", f"{n} lines; keep it at most 200 and move the rest into docs/"))
    for doc in documents(src):
        for n, line in prose_lines(os.path.join(src, doc)):
            for rx, why in NOTEBOOK:
                if rx.search(line):
                    problems.append((f"{doc}:{n}", why))
            if line.lstrip().startswith("|") and doc not in CELL_LIMIT_EXEMPT:
                for cell in line.split("|"):
                    if len(cell.strip()) > MAX_CELL:
                        problems.append((f"{doc}:{n}", f"a table cell of {len(cell.strip())} characters: split it (at most {MAX_CELL})"))
    return problems


def main(argv):
    if len(argv) >= 3 and argv[1] == "lint":
        blocks, problems = read_blocks(argv[2])
        for where, p in problems:
            print(f"{where}: {p}")
        runs = sum(len(b["commands"]) for b in blocks if b["run"])
        outs = sum(1 for b in blocks if b["run"] for c in b["commands"] if c["expect"])
        counts = {}
        for b in blocks:
            if b["reason"]:
                counts[b["reason"]] = counts.get(b["reason"], 0) + 1
        print(f"docs_blocks: {len(blocks)} shell blocks, {runs} commands to run ({outs} checked on their output), not run: "
              + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        return 1 if problems else 0
    if len(argv) >= 3 and argv[1] in ("links", "style"):
        problems = check_links(argv[2]) if argv[1] == "links" else check_style(argv[2])
        for where, p in problems:
            print(f"{where}: {p}")
        return 1 if problems else 0
    if len(argv) >= 3 and argv[1] == "norun-words":
        # Each command line of the blocks not run: WHERE, then its first two words.
        blocks, _ = read_blocks(argv[2])
        for b in blocks:
            if b["run"]:
                continue
            for i, line in enumerate(b["body"]):
                w = line.split("#", 1)[0].split()
                if w and not line.startswith((" ", "\t")):
                    print(f"{b['doc']}:{b['line'] + 1 + i}\t{w[0]}\t{w[1] if len(w) > 1 else ''}")
        return 0
    if len(argv) >= 3 and argv[1] == "blocks":
        blocks, problems = read_blocks(argv[2])
        json.dump({"blocks": blocks, "problems": problems}, sys.stdout, indent=1)
        return 0
    if len(argv) == 8 and argv[1] == "script":
        text, n = script(*argv[2:8])
        sys.stdout.write(text)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
