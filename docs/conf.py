"""Sphinx configuration of the dramatiq-redisson docs: Markdown pages (myst-parser), the
furo theme, and an API reference generated from the package's docstrings.

Build with ``tox -e docs`` (warnings are errors, internal links are checked)."""

from __future__ import annotations

import dramatiq_redisson

project = "dramatiq-redisson"
author = "dramatiq-redisson contributors"
copyright = "dramatiq-redisson contributors"
release = dramatiq_redisson.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# Markdown: every heading down to H4 gets an anchor, so `[x](page.md#heading)` links are
# checked (a missing page or anchor is a warning, and the build turns warnings into errors).
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]
# The included benchmarks/README.md jumps from H1 to H3 in places; a level skip is not a
# broken link, so it is not an error.
suppress_warnings = ["myst.header"]

# The API reference: members in source order, type hints in the description, Google-style
# sections ("Parameters:", "Attributes:", "Raises:") read by napoleon.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

html_theme = "furo"
html_title = f"dramatiq-redisson {release}"
html_static_path: list[str] = []

# No intersphinx (the docs build offline): references to other projects' names cannot
# resolve, nor can references to the package's private modules and constants, which the
# reference does not document. Everything else must resolve (-n in tox -e docs).
nitpick_ignore_regex = [
    (r"py:.*", r"(dramatiq|redis|prometheus_client|opentelemetry|datetime|collections|typing|logging)(\..*)?"),
    (r"py:.*", r"(trace\.TracerProvider|TextMapPropagator|SkipMessage)"),
    (r"py:.*", r"(Message|Middleware|CollectorRegistry|RedisCluster|NoPermissionError|WSGIApp)"),
    (r"py:.*", r"(dramatiq_redisson\.)?(\w+\.)?_.*"),  # private modules, in the sub-packages too
    (r"py:.*", r"[A-Z][A-Z0-9_]+"),
    # Private helpers and the Protocols the handles take (the broker's internals).
    (r"py:.*", r"(QueueAdmin\.)?known|\w+Host|QueueJoinTimeout|Prometheus|channel|timeout_zset"),
    (r"py:.*", r"connection_commands|match_needles|dedupe_options|ScheduledPage\.cursor"),
    # A workflow step's type alias (a message, a chain or a group).
    (r"py:.*", r"Step"),
]


def _resolve_in_package(app, env, node, contnode):  # type: ignore[no-untyped-def]
    """A docstring of a private module names a public object as it is spelt there
    (``RedissonBroker.stats``); the reference documents it as ``dramatiq_redisson.…``."""
    if node.get("refdomain") != "py" or node["reftarget"].startswith("dramatiq_redisson."):
        return None
    domain = env.get_domain("py")
    return domain.resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], "dramatiq_redisson." + node["reftarget"], node, contnode
    )


def _napoleon_but_not_attributes(app, what, name, obj, options, lines):  # type: ignore[no-untyped-def]
    """Napoleon reads an attribute's first line "type: description" as a type; the
    package's attribute docstrings are prose ("Lanes with ready messages: …"), so they are
    left as written."""
    if what in ("attribute", "data", "property"):
        return
    from sphinx.ext.napoleon import _process_docstring

    _process_docstring(app, what, name, obj, options, lines)


def setup(app):  # type: ignore[no-untyped-def]
    from sphinx.ext.napoleon import _process_docstring

    listeners = app.events.listeners["autodoc-process-docstring"]
    listeners[:] = [entry for entry in listeners if entry.handler is not _process_docstring]
    app.connect("autodoc-process-docstring", _napoleon_but_not_attributes)
    app.connect("missing-reference", _resolve_in_package)
