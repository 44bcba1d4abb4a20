"""The one HTML page every HTML report extends (Jinja2): the document, its title, the style all
reports share, and the blocks a report fills.

A report's page template starts with ``{% extends "base.html" %}`` and fills ``title``, ``body``
and, where it needs more than the shared style, ``style`` (CSS added after the shared rules) and
``width`` (the page's greatest width). The pages are self-contained: no script, no external
asset; plots are inline SVG or data URIs.
"""

from __future__ import annotations

import io

from jinja2 import DictLoader, Environment, select_autoescape
from markupsafe import Markup

BASE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>{% block title %}specadapt{% endblock %}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: {% block width %}70em{% endblock %}; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 1em 0; } td, th { border: 1px solid #ccc; padding: .3em .6em; }
th { background: #f3f3f3; } .plots { display: flex; flex-wrap: wrap; gap: 1em; }
{% block style %}{% endblock %}
</style></head><body>
{% block body %}{% endblock %}
</body></html>
"""
"""The base template, ``base.html`` to the templates that extend it."""


def environment(templates: dict[str, str], **helpers) -> Environment:
    """A Jinja environment (autoescaped) that knows ``base.html`` and ``templates`` ({name: source}),
    with ``helpers`` as globals."""
    env = Environment(loader=DictLoader({"base.html": BASE, **templates}),
                      autoescape=select_autoescape(default=True, default_for_string=True))
    env.globals.update(helpers)
    return env


def pyplot():
    """matplotlib.pyplot on its file-only backend (Agg): imported when a page has a plot to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def svg_text(fig) -> str:
    """A matplotlib figure as SVG text without the XML prolog and DOCTYPE (nothing to fetch), and
    without a date, so that the same figure gives the same text."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def inline_svg(fig) -> Markup:
    """A matplotlib figure as SVG to put in a page as it is."""
    return Markup(svg_text(fig))
