#!/usr/bin/env python3
"""Writes the expected renderings of every chat template here for every case of cases.json,
as Hugging Face's transformers renders them with Python's jinja2 (3.1.6): <template>.<case>.out
holds the text; <template>.<case>.err holds "raise: MESSAGE" for the template's own
raise_exception, "error: TYPE" for another failure. Run once with jinja2 installed
(`.venv/bin/pip install jinja2==3.1.6`); the C++ test reads the files and needs no Python.
"""
import json
import pathlib
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = pathlib.Path(__file__).parent
NOW = datetime(2024, 7, 26, 12, 0, 0)  # the C++ test passes the same time


class TemplateError(Exception):
    pass


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class Generation(Extension):
    """transformers' {% generation %} tag: renders its content."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: NOW.strftime(fmt)
    return env


def main():
    spec = json.loads((HERE / "cases.json").read_text())
    env = environment()
    for path in sorted(HERE.glob("*.jinja")):
        template = env.from_string(path.read_text(encoding="utf-8"))
        for name, case in spec["cases"].items():
            ctx = {k: v for k, v in case.items() if k != "with_tools"}
            ctx.update(bos_token="<s>", eos_token="</s>")
            if case.get("with_tools"):
                ctx["tools"] = spec["tools"]
            stem = HERE / f"{path.stem}.{name}"
            for old in (stem.with_suffix(stem.suffix + ".out"), stem.with_suffix(stem.suffix + ".err")):
                old.unlink(missing_ok=True)
            try:
                text = template.render(**ctx)
                (HERE / f"{path.stem}.{name}.out").write_bytes(text.encode("utf-8"))
            except TemplateError as e:
                (HERE / f"{path.stem}.{name}.err").write_text(f"raise: {e}", encoding="utf-8")
            except Exception as e:  # noqa: BLE001 (recorded: the C++ engine must fail too)
                (HERE / f"{path.stem}.{name}.err").write_text(f"error: {type(e).__name__}", encoding="utf-8")


if __name__ == "__main__":
    main()


def snippets():
    """snippets.json: small templates exercising one construct each; their renderings (or
    failures) go to snippets.expected.json."""
    env = environment()
    out = []
    for s in json.loads((HERE / "snippets.json").read_text(encoding="utf-8")):
        try:
            out.append({"out": env.from_string(s["t"]).render(**s.get("c", {}))})
        except TemplateError as e:
            out.append({"raise": str(e)})
        except Exception as e:  # noqa: BLE001
            out.append({"error": type(e).__name__})
    (HERE / "snippets.expected.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    snippets()
