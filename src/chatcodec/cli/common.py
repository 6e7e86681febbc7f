"""What every command shares: reading requests, the shared options, and reporting errors.

A command adds the options it takes with the ``add_*`` functions and reads them back with the
function of the same name without ``add_`` (``add_template_options`` then ``template_from``), so that
an option means one thing in every command:

* ``FILE``: a chat as JSON, from a file or stdin (``-``): a bare list of messages, or a request body
  with ``messages`` and optionally ``tools``, ``documents``, ``chat_template_kwargs``,
  ``add_generation_prompt`` and ``continue_final_message`` (:func:`read_request`);
* ``-t/--template NAME|PATH`` and ``--tokenizer PATH`` (:func:`template_from`, :func:`codec_from`);
* ``--var KEY=VALUE``, ``--vars JSON`` and ``--tools FILE`` (:func:`variables_from`, :func:`tools_from`);
* ``--json`` for programs and ``--show`` for people (:func:`add_output_options`);
* ``--max-output N`` and ``--timeout SECONDS``, the render budget (:func:`limits_from`);
* ``--max-input SIZE`` (every command): the most bytes a command reads from one input file or stdin,
  :data:`MAX_INPUT_BYTES` by default (:func:`read_input`, :func:`read_text`).

Errors: a command raises :class:`~chatcodec.ChatcodecError` for anything the user can fix, and
:func:`run` prints it as one line on stderr with exit code 2. Any other exception is a chatcodec bug;
it is printed as one line too (exit 2), unless ``CHATCODEC_DEBUG`` is set, which shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from ..exceptions import ChatcodecError, InputError, RenderWarning
from ..limits import Limits
from ..polyfills import POLYFILLS, Polyfill
from ..render import ChatTemplate
from ..templates import load_template

if TYPE_CHECKING:
    from ..tokens import Codec

__all__ = [
    "EXIT_USAGE",
    "MAX_INPUT_BYTES",
    "ArgumentParser",
    "Request",
    "add_engine_option",
    "add_input_limit",
    "add_limit_options",
    "add_output_options",
    "add_render_options",
    "add_request_input",
    "add_template_options",
    "add_variable_options",
    "codec_from",
    "color_wanted",
    "fail",
    "flush_notes",
    "in_flags",
    "input_limit",
    "limits_from",
    "note",
    "positive_float",
    "positive_int",
    "read_input",
    "read_json",
    "read_request",
    "read_text",
    "refuse_overwriting",
    "render_options_from",
    "run",
    "template_from",
    "tools_from",
    "variables_from",
]

EXIT_USAGE = 2
#: the most bytes a command reads from one input (a file, stdin) unless --max-input raises it
MAX_INPUT_BYTES = 64 * 2**20
#: the template ``render`` uses when neither ``--template`` nor ``--tokenizer`` names one
DEFAULT_TEMPLATE = "chatml"
#: arguments of ``ChatTemplate.render`` and ``Codec.encode``: a template variable cannot take these names
RESERVED_VARIABLES = frozenset(
    {
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "now",
        "chat_template",
        "content_special_tokens",
        "add_special_tokens",
        "polyfill",
    }
)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported as every other error is: one line, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"chatcodec: error: {message} (see {self.prog} --help)\n")


def run(parser: argparse.ArgumentParser, argv: Sequence[str]) -> int:
    """Parse ``argv`` and run the chosen command, turning every error it raises into one line and exit 2."""
    args = parser.parse_args(argv)
    command: Callable[[argparse.Namespace], int] | None = getattr(args, "run", None)
    if command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    _notes.clear()
    _input_limit[0] = getattr(args, "max_input", None) or MAX_INPUT_BYTES
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", RenderWarning)
            warnings.showwarning = _show_warning
            code = command(args)
    except ChatcodecError as exc:
        return fail(in_flags(str(exc)))
    except RecursionError:
        return fail("the input nests too deeply (or refers to itself); pass plain JSON-like data")
    except BrokenPipeError:
        # `chatcodec render ... | head` closed the pipe early: not an error worth a traceback
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())  # what Python flushes at exit goes nowhere, quietly
        os.close(null)
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a library error that is not (yet) a ChatcodecError: still one line
        if os.environ.get("CHATCODEC_DEBUG"):
            raise
        return fail(
            f"{type(exc).__name__}: {exc} (unexpected: please report it; CHATCODEC_DEBUG=1 shows the traceback)"
        )
    flush_notes()
    return code


#: what the library's errors tell a caller to raise, and the command-line flag that raises it
_FLAGS = {
    "Limits(max_output=...)": "the limit with --max-output N",
    "Limits(timeout=...)": "the limit with --timeout SECONDS",
}


def in_flags(message: str) -> str:
    """A library error as the command line says it: ``Limits(max_output=...)`` becomes ``--max-output N``.

    >>> in_flags("Raise Limits(timeout=...) if the input really needs it.")
    'Raise the limit with --timeout SECONDS if the input really needs it.'
    """
    for setting, flag in _FLAGS.items():
        message = message.replace(setting, flag)
    return message


def _show_warning(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
    """A library warning as the command line says it: one ``chatcodec: warning:`` line on stderr."""
    print(f"chatcodec: warning: {message}", file=sys.stderr)


def fail(message: str) -> int:
    """Print ``message`` as the command's one error line (with any pending note); returns the exit code."""
    first_line = message.strip().splitlines()[0] if message.strip() else "failed"
    context = f" [{'; '.join(_notes)}]" if _notes else ""
    _notes.clear()
    print(f"chatcodec: error: {first_line}{context}", file=sys.stderr)
    return EXIT_USAGE


_notes: list[str] = []


def note(message: str) -> None:
    """Tell the user about a choice made for them (a default template, say).

    Notes go to stderr when the command ends well (or at :func:`flush_notes`, for a command that runs on);
    when it fails, they end its one error line, in brackets.
    """
    _notes.append(message)


def flush_notes() -> None:
    """Print the pending notes now (a long-running command calls this once it has started)."""
    for message in _notes:
        print(f"chatcodec: note: {message}", file=sys.stderr)
    _notes.clear()


def color_wanted() -> bool:
    """Colour on a terminal, or when FORCE_COLOR is set; never when NO_COLOR is."""
    if os.environ.get("NO_COLOR"):
        return False
    return sys.stdout.isatty() or bool(os.environ.get("FORCE_COLOR"))


# --- reading inputs, JSON and requests -----------------------------------------------------------------

#: the input limit of the command that runs (``--max-input``), set by :func:`run`
_input_limit = [MAX_INPUT_BYTES]


def add_input_limit(parser: argparse.ArgumentParser) -> None:
    """``--max-input SIZE``: the most bytes one input may hold (every command takes it)."""
    parser.add_argument(
        "--max-input",
        type=byte_size,
        metavar="SIZE",
        help=f"the most bytes read from one input file or stdin, e.g. 200M or 2G (default: {MAX_INPUT_BYTES >> 20}M)",
    )


def byte_size(text: str) -> int:
    """An argparse ``type``: a number of bytes, with an optional K, M or G (powers of 1024)."""
    number, unit = (text[:-1], text[-1].upper()) if text[-1:].upper() in "KMG" and text[-1:] else (text, "")
    try:
        value = int(number) << {"": 0, "K": 10, "M": 20, "G": 30}[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 200M, 2G or 1048576") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1 byte")
    return value


def input_limit() -> int:
    """The most bytes one input may hold in the command that runs (``--max-input``)."""
    return _input_limit[0]


def read_input(path: str, what: str) -> bytes:
    """The bytes of ``path`` (``-`` for stdin), at most ``--max-input`` of them; one-line errors name the file.

    The limit is checked while reading, so ``/dev/zero`` or an endless pipe is refused after the limit, not
    read until memory runs out.
    """
    label = "stdin" if path == "-" else path
    limit = _input_limit[0]
    try:
        if path == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with Path(path).expanduser().open("rb") as f:
                data = f.read(limit + 1)
    except FileNotFoundError:
        raise InputError(f"{what} file {path} does not exist") from None
    except IsADirectoryError:
        raise InputError(f"{what} file {path} is a folder, not a file") from None
    except OSError as exc:
        raise InputError(f"cannot read {what} from {label}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise InputError(f"{what} in {label} is over {limit:,} bytes, the input limit; raise it with --max-input SIZE")
    return data


def read_text(path: str, what: str) -> str:
    """:func:`read_input` as UTF-8 text (strict: a byte that is not UTF-8 is an error naming its offset)."""
    data = read_input(path, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        label = "stdin" if path == "-" else path
        raise InputError(f"{what} in {label} is not UTF-8 text (byte {exc.start}: {data[exc.start]:#04x})") from None


def refuse_overwriting(flag: str, output: str, inputs: dict[str, str | None]) -> None:
    """Refuse, before anything is opened for writing, an output path that is one of the command's inputs.

    ``inputs`` maps each input's flag (``"FILE"``, ``"--tools"``) to its path (``-`` and None are not files).
    """
    if output == "-":
        return
    target = Path(output).expanduser()
    for name, given in inputs.items():
        if given is None or given == "-":
            continue
        source = Path(given).expanduser()
        if not source.is_file():
            continue
        same = os.path.samefile(source, target) if target.exists() else source.resolve() == target.resolve()
        if same:
            raise InputError(
                f"{flag} {output} is the input {name} {given}: writing it would destroy it; give another path"
            )


def read_json(path: str, what: str) -> Any:
    """Parse JSON from ``path`` (``-`` for stdin), failing with one line that names the file."""
    return parse_json(read_text(path, what), "stdin" if path == "-" else path, what)


def read_jsonl(path: str, what: str) -> list[tuple[int, dict[str, Any]]]:
    """The JSON objects of a JSON-lines file, each with its line number (blank lines skipped); one-line errors
    name the file and line."""
    text = read_text(path, what)
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        row = parse_json(line, f"{path} line {number}", what)
        if not isinstance(row, dict):
            raise InputError(f"{path} line {number} must be a JSON object")
        rows.append((number, row))
    return rows


def parse_json(text: str, label: str, what: str) -> Any:
    """``text`` as JSON; ``label`` names where it came from in the error."""
    if not text.strip():
        raise InputError(f"{what} input ({label}) is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{label} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except RecursionError:
        raise InputError(f"{label} nests JSON too deeply to read") from None
    except ValueError as exc:  # an integer of thousands of digits (Python's int_max_str_digits)
        raise InputError(f"{label} holds a value chatcodec cannot read: {exc}") from None
    if _SURROGATE_ESCAPE.search(text):
        _check_surrogates(data, label)
    return data


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_surrogates(data: Any, label: str) -> None:
    """Refuse strings with a lone surrogate (``"\\ud800"``): no UTF-8 output or tokenizer can hold one."""
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            found = _LONE_SURROGATE.search(value)
            if found:
                raise InputError(
                    f"{label} holds a lone surrogate (\\u{ord(found.group()):04x}), which is not a character;"
                    " pair it or remove it"
                )
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


@dataclass
class Request:
    """A chat as a command reads it: messages plus what a request body may carry."""

    messages: list[dict[str, Any]]
    label: str
    tools: list[Any] | None = None
    documents: list[Any] | None = None
    variables: dict[str, Any] = field(default_factory=dict)
    add_generation_prompt: bool | None = None
    continue_final_message: bool | str | None = None


def add_request_input(parser: argparse.ArgumentParser) -> None:
    """The positional ``FILE``: the chat, as a message list or a request body (read by :func:`read_request`)."""
    parser.add_argument(
        "file",
        nargs="?",
        default="-",
        metavar="FILE",
        help="JSON file with a list of messages or a request body with 'messages'; - or nothing for stdin",
    )


def read_request(path: str) -> Request:
    """Read a chat from ``path``: a bare message list, or a request body with ``messages`` and more."""
    label = "stdin" if path == "-" else path
    return request_from(read_json(path, "messages"), label)


def request_from(data: Any, label: str) -> Request:
    """Check a parsed message list or request body; errors name ``label`` and the field."""
    body = {"messages": data} if isinstance(data, list) else data
    if not isinstance(body, dict) or "messages" not in body:
        raise InputError(f'{label} must hold a list of messages or a request body with "messages"')
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise InputError(f'"messages" in {label} must be a non-empty list')
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InputError(f"message {index} in {label} is {_json_type(message)}, not an object")
        if not isinstance(message.get("role"), str):
            raise InputError(f'message {index} in {label} has no "role" string')
    request = Request(messages=messages, label=label)
    request.tools = _optional_list(body, "tools", label)
    request.documents = _optional_list(body, "documents", label)
    if request.documents is not None:
        for index, document in enumerate(request.documents):
            if not isinstance(document, dict):
                raise InputError(f"document {index} in {label} is {_json_type(document)}, not an object")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise InputError(f'"chat_template_kwargs" in {label} must be an object, not {_json_type(kwargs)}')
        request.variables = _checked_variables(kwargs, f'"chat_template_kwargs" in {label}')
    generation = body.get("add_generation_prompt")
    if generation is not None and not isinstance(generation, bool):
        raise InputError(f'"add_generation_prompt" in {label} must be true or false, not {_json_type(generation)}')
    request.add_generation_prompt = generation
    continued = body.get("continue_final_message")
    if continued is not None and not isinstance(continued, (bool, str)):
        raise InputError(
            f'"continue_final_message" in {label} must be true, false or a field name, not {_json_type(continued)}'
        )
    request.continue_final_message = continued
    return request


def _optional_list(body: dict[str, Any], key: str, label: str) -> list[Any] | None:
    value = body.get(key)
    if value is not None and not isinstance(value, list):
        raise InputError(f'"{key}" in {label} must be a list, not {_json_type(value)}')
    return value


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


# --- -t/--template and --tokenizer -------------------------------------------------------------------


def add_template_options(parser: argparse.ArgumentParser, *, default_note: str = "") -> None:
    """``-t/--template NAME|PATH`` and ``--tokenizer PATH``; read them with :func:`template_from` or
    :func:`codec_from`. ``default_note`` ends the help of ``--template`` (say what happens without it)."""
    parser.add_argument(
        "-t",
        "--template",
        metavar="NAME|PATH",
        help="chat template: a built-in name (see `chatcodec templates`), a model folder or a template file"
        + (f" ({default_note})" if default_note else ""),
    )
    parser.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="model folder with tokenizer.json (or the tokenizer.json file); its chat template is used"
        " unless --template names another",
    )


def template_from(args: argparse.Namespace, *, default: str = DEFAULT_TEMPLATE) -> ChatTemplate:
    """The template ``--template`` names, else the one in ``--tokenizer``'s folder, else the built-in
    ``default`` (saying so on stderr). ``--max-output`` and ``--timeout`` set its budget."""
    if args.template is not None:
        template = load_template(args.template)
    elif getattr(args, "tokenizer", None) is not None:
        template = load_template(_model_folder(args.tokenizer))
    else:
        note(f"no --template given: using the built-in {default!r} template")
        template = load_template(default)
    return with_limits(template, args)


def codec_from(args: argparse.Namespace) -> Codec:
    """A :class:`~chatcodec.Codec` from ``--tokenizer``, with ``--template`` replacing its template if given."""
    from ..tokens import load

    if args.tokenizer is None:
        raise InputError("this command needs --tokenizer PATH: a model folder with tokenizer.json")
    given = Path(args.tokenizer).expanduser()
    folder = _model_folder(args.tokenizer)
    tokenizer = given if given.name == "tokenizer.json" and given.is_file() else folder / "tokenizer.json"
    if not tokenizer.is_file():
        raise InputError(
            f"--tokenizer {args.tokenizer}: there is no tokenizer.json in {folder}; give a model folder that has one"
        )
    codec = load(folder, tokenizer=tokenizer)
    if args.template is not None:
        codec = codec.with_template(load_template(args.template))
    with_limits(codec.template, args)
    return codec


def _model_folder(path: str) -> Path:
    """``--tokenizer`` names a folder or a file in it (``tokenizer.json``, ``tokenizer_config.json``)."""
    location = Path(path).expanduser()
    if location.is_file() and location.suffix == ".json":
        return location.parent
    if not location.exists():
        raise InputError(f"--tokenizer {path}: no such folder or file")
    return location


# --- --var, --vars and --tools -----------------------------------------------------------------------


def add_variable_options(parser: argparse.ArgumentParser, *, tools: bool = True) -> None:
    """``--var KEY=VALUE`` (repeatable), ``--vars JSON`` and ``--tools FILE``; read them with
    :func:`variables_from` and :func:`tools_from`."""
    parser.add_argument(
        "--var",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help='a template variable; VALUE is JSON (true, 3, "text"; Python\'s True/False/None too), e.g.'
        " --var enable_thinking=false or --var 'reasoning_effort=\"high\"' (repeatable; wins over --vars)",
    )
    parser.add_argument(
        "--vars",
        metavar="JSON",
        help="template variables as a JSON object, inline ('{\"enable_thinking\": false}') or a file;"
        " they win over the request's chat_template_kwargs",
    )
    if tools:
        parser.add_argument(
            "--tools",
            metavar="FILE",
            help="JSON file with a list of tools (OpenAI format), or a request body with 'tools';"
            " replaces the request's tools",
        )


def variables_from(args: argparse.Namespace, request: Request | None = None) -> dict[str, Any]:
    """Template variables: the request's ``chat_template_kwargs``, then ``--vars``, then each ``--var``."""
    variables = dict(request.variables) if request is not None else {}
    if args.vars is not None:
        text = args.vars
        is_path = not text.lstrip().startswith(("{", "[")) and Path(text).expanduser().exists()
        data = read_json(text, "--vars") if is_path else parse_json(text, "--vars", "--vars")
        if not isinstance(data, dict):
            raise InputError(f"--vars takes a JSON object of template variables, not {_json_type(data)}")
        variables.update(_checked_variables(data, "--vars"))
    for assignment in args.var:
        key, value = parse_var(assignment)
        variables[key] = value
    return variables


_PYTHON_WORDS = {"True": True, "False": False, "None": None}


def parse_var(assignment: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE as JSON (Python's ``True``/``False``/``None`` accepted).

    >>> parse_var("enable_thinking=False")
    ('enable_thinking', False)
    >>> parse_var('effort="high"')
    ('effort', 'high')
    """
    key, sep, raw = assignment.partition("=")
    if not sep or not key.isidentifier():
        raise InputError(f"--var takes KEY=VALUE, e.g. --var enable_thinking=false; got {assignment!r}")
    _check_name(key, "--var")
    if raw.strip() in _PYTHON_WORDS:
        return key, _PYTHON_WORDS[raw.strip()]
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise InputError(
            f"--var {key}: {raw!r} is not a JSON value; quote a string as JSON inside shell quotes,"
            f" e.g. --var '{key}=\"{raw}\"'"
        ) from None
    return key, value


def _checked_variables(variables: dict[str, Any], where: str) -> dict[str, Any]:
    for key in variables:
        _check_name(key, where)
    return variables


def _check_name(key: str, where: str) -> None:
    if key in RESERVED_VARIABLES:
        raise InputError(
            f"{where}: {key!r} is not a template variable you can set (it is an argument of the render);"
            " use the command's own option or the request field"
        )


def tools_from(args: argparse.Namespace, request: Request | None = None) -> list[Any] | None:
    """The tools of ``--tools FILE`` (a list, or a request body with ``tools``), else the request's."""
    if getattr(args, "tools", None) is None:
        return request.tools if request is not None else None
    data = read_json(args.tools, "tools")
    tools = data.get("tools") if isinstance(data, dict) else data
    if not isinstance(tools, list):
        raise InputError(f"tools file {args.tools} must hold a list of tools, or a request body with a 'tools' list")
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise InputError(f"tool {index} in {args.tools} is {_json_type(tool)}, not an object")
    return tools


# --- the generation prompt, continuing the final message, the clock -----------------------------------


def add_render_options(parser: argparse.ArgumentParser) -> None:
    """``--add-generation-prompt``, ``--continue-final-message``, ``--now`` and ``--polyfill``; read them
    with :func:`render_options_from`."""
    parser.add_argument(
        "--add-generation-prompt",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="open an assistant turn at the end, for the model to answer (default: the request's"
        " add_generation_prompt, else off, as in the Python API and transformers)",
    )
    parser.add_argument(
        "--continue-final-message",
        action="store_true",
        default=None,
        help="leave the final message open for the model to continue",
    )
    parser.add_argument("--now", metavar="ISO-DATE", help="pin the template's clock, e.g. 2026-11-29T12:00")
    parser.add_argument(
        "--polyfill",
        metavar="auto|NAME,...",
        help="rewrite what the template cannot render: 'auto' (what it lacks, see chatcodec inspect) or rewrites"
        f" by name ({', '.join(POLYFILLS)}); default: none, the exact render",
    )


def render_options_from(args: argparse.Namespace, request: Request) -> dict[str, Any]:
    """The keyword arguments of ``render``/``encode`` besides template variables.

    One rule for the generation prompt everywhere (commands and Python API, as in transformers): it is
    added only when asked for, by ``--add-generation-prompt`` or the request's ``add_generation_prompt``
    (the option wins).
    """
    return {
        "tools": tools_from(args, request),
        "documents": request.documents,
        "add_generation_prompt": bool(_first(args.add_generation_prompt, request.add_generation_prompt, False)),
        "continue_final_message": _first(args.continue_final_message, request.continue_final_message, False),
        "now": parse_now(args.now),
        "polyfill": _polyfill(args.polyfill),
    }


def _polyfill(text: str | None) -> Polyfill:
    if text is None:
        return False
    if text.strip() == "auto":
        return "auto"
    names = frozenset(name.strip() for name in text.split(",") if name.strip())  # unknown ones: the library says
    if not names:
        raise InputError("--polyfill needs 'auto' or rewrite names separated by commas")
    return names


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def parse_now(text: str | None) -> datetime | None:
    """``--now``: an ISO date or date-time."""
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise InputError(f"--now takes an ISO date or date-time such as 2026-11-29T12:00, not {text!r}") from None


# --- --json and --show --------------------------------------------------------------------------------


def add_output_options(parser: argparse.ArgumentParser, *, json_help: str, show_help: str) -> None:
    """``--json`` (for programs) and ``--show`` (for people), which exclude each other."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--json", action="store_true", help=json_help)
    group.add_argument("--show", action="store_true", help=show_help)


# --- --max-output and --timeout ------------------------------------------------------------------------


def add_limit_options(parser: argparse.ArgumentParser) -> None:
    """``--max-output N`` and ``--timeout SECONDS``: the render budget (:class:`~chatcodec.Limits`)."""
    defaults = Limits()
    parser.add_argument(
        "--max-output",
        type=positive_int,
        metavar="N",
        help=f"longest prompt (and string built on the way) a template may produce, in characters"
        f" (default: {defaults.max_output:,})",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        metavar="SECONDS",
        help=f"longest a template may take to render (default: {defaults.timeout:g})",
    )


def limits_from(args: argparse.Namespace) -> Limits | None:
    """The :class:`~chatcodec.Limits` that ``--max-output`` and ``--timeout`` ask for; None for the defaults."""
    changes = {
        key: value
        for key in ("max_output", "timeout")
        if (value := getattr(args, key, None)) is not None  # a command may not take these options
    }
    return Limits(**changes) if changes else None


def with_limits(template: ChatTemplate, args: argparse.Namespace) -> ChatTemplate:
    limits = limits_from(args)
    if limits is not None:
        template.limits = limits
    return template


def positive_int(text: str) -> int:
    """An argparse ``type``: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a number above 0")
    return value


def add_engine_option(parser: argparse.ArgumentParser) -> None:
    """``--engine auto|default|safe``: the llama.cpp configuration, shared by every command that runs the model."""
    parser.add_argument(
        "--engine",
        choices=("auto", "default", "safe"),
        default=None,
        help="embedded model: llama.cpp's configuration: auto checks it in a child process first (once per"
        " machine and build, cached), default and safe (no extra buffer types: no AMX or repacked weights) force"
        " one without a check (default: $CHATCODEC_ENGINE, else auto)",
    )
