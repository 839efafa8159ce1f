#!/usr/bin/env python3
"""check_example_config.py HELP_TEXT EXAMPLE_YAML - conf/example-full.yaml
against the option table as `ps-server --help` prints it (the help is
generated from common/config_table.c): every option of the table appears
in the example (set, or named in a comment where the example cannot set it
beside the others), with its default unless the example's line says why it
differs (a comment containing "default"); no key of the example is unknown.
Prints one line per disagreement and exits 1 when there is any."""
import re
import sys

import yaml


def table(help_path):
    """{key: default text or None} from the help's configuration section."""
    opts, key, in_cfg = {}, None, False
    for line in open(help_path, encoding="utf-8"):
        if line.startswith("Configuration file"):
            in_cfg = True
            continue
        if not in_cfg:
            continue
        m = re.match(r"^  ([a-z_][a-z0-9_.\[\]]*)\s*$", line)
        if m:
            key = m.group(1)
            opts[key] = None
            continue
        if key and opts[key] is None and line.startswith("      "):
            m = re.search(r"; default (.*)$", line.rstrip("\n"))
            opts[key] = m.group(1) if m else ""
            if opts[key] == "":
                opts[key] = None
            key = None if m or re.search(r"; (required|optional)$", line) else key
    return opts


def flatten(node, path, out):
    if isinstance(node, dict):
        for k, v in node.items():
            flatten(v, f"{path}.{k}" if path else k, out)
    elif isinstance(node, list) and node and all(isinstance(x, dict) for x in node):
        out.setdefault(path, []).append(node)
        for item in node:
            flatten(item, path + "[]", out)
    else:
        out.setdefault(path, []).append(node)


def main():
    opts = table(sys.argv[1])
    text = open(sys.argv[2], encoding="utf-8").read()
    found = {}
    flatten(yaml.load(text, Loader=yaml.BaseLoader), "", found)
    bad = []
    if len(opts) < 50:
        bad.append(f"{sys.argv[1]}: only {len(opts)} options read from the help text")
    for key in found:
        if key not in opts:
            bad.append(f"{sys.argv[2]}: '{key}' is not an option of the table (ps-server --help)")
    for key, default in opts.items():
        if key not in found:
            # an option the example cannot set beside the others (a model is
            # a preset, layers or tensors) is described in a comment
            leaf = re.escape(key.rsplit(".", 1)[-1].replace("[]", ""))
            if any(re.search(rf"\b{leaf}\b", l.split("#", 1)[1]) for l in text.splitlines()
                   if "#" in l):
                continue
            bad.append(f"{sys.argv[2]}: option '{key}' is missing (default {default})")
            continue
        if default is None or "[]" in key:
            continue
        value = found[key][0]
        value = value if isinstance(value, str) else yaml.safe_dump(value).strip()
        if value == default or (default == '""' and value == ""):
            continue
        # a line that sets another value must say so: "... (default X) ..."
        leaf = key.rsplit(".", 1)[-1]
        lines = [l for l in text.splitlines() if re.match(rf"^\s*{re.escape(leaf)}:", l)]
        if not any("default" in l.split("#", 1)[-1] for l in lines if "#" in l):
            bad.append(f"{sys.argv[2]}: '{key}: {value}', but the table's default is {default}"
                       " (set the default, or say on the line why not)")
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
