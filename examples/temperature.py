"""The seed's function-calling example: two temperature tools, run against `chatcodec serve`.

Start the server (the embedded model needs no arguments), then run this file:

    chatcodec serve &
    python examples/temperature.py                    # results as role "tool" (OpenAI tools=[...])
    python examples/temperature.py --style functions  # Qwen-Agent's form: functions=[...], role "function"
    python examples/temperature.py --local            # no server: the embedded model in this process

The same loop from the command line: `chatcodec tools run examples/temperature.py --url http://127.0.0.1:8000/v1`.
The functions return fixed values, as in the Qwen3 function-calling guide this example comes from.
"""

from __future__ import annotations

import argparse
import json
from typing import Literal

#: a Literal: every SDK that builds a schema from the signature (transformers, chatcodec, the MCP SDK) gives it an enum
Unit = Literal["celsius", "fahrenheit"]

QUESTION = "What's the temperature in San Francisco now? How about tomorrow? Current Date: 2024-09-30."


def get_current_temperature(location: str, unit: Unit = "celsius"):
    """Get current temperature at a location.

    Args:
        location: The location to get the temperature for, in the format "City, State, Country".
        unit: The unit to return the temperature in. Defaults to "celsius".

    Returns:
        the temperature, the location, and the unit in a dict
    """
    return {"temperature": 26.1, "location": location, "unit": unit}


def get_temperature_date(location: str, date: str, unit: Unit = "celsius"):
    """Get temperature at a location and date.

    Args:
        location: The location to get the temperature for, in the format "City, State, Country".
        date: The date to get the temperature for, in the format "Year-Month-Day".
        unit: The unit to return the temperature in. Defaults to "celsius".

    Returns:
        the temperature, the location, the date and the unit in a dict
    """
    return {"temperature": 25.9, "location": location, "date": date, "unit": unit}


TOOLS = [get_current_temperature, get_temperature_date]


def tool_choice(style: str = "tools"):
    """Each round's tool choice: "required" first, then by name each function not called yet, then "none".

    The embedded model (SmolLM2, 135M parameters) picks get_temperature_date whenever it may choose, so
    the loop names the other one; "none" then asks for the answer. The legacy functions style has no
    "required": it names the functions from the first round on.
    """
    names = [function.__name__ for function in TOOLS]

    def choose(index, transcript):
        called = {call["function"]["name"] for message in transcript for call in message.get("tool_calls") or ()}
        called |= {message["function_call"]["name"] for message in transcript if message.get("function_call")}
        missing = [name for name in names if name not in called]
        if index == 0 and style == "tools":
            return "required"
        return missing[0] if missing else "none"

    return choose


def main() -> None:
    from chatcodec import Toolbox

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1", help="the server's OpenAI-compatible base URL")
    parser.add_argument("--model", help="the model name to send (default: the server's first)")
    parser.add_argument("--style", choices=["tools", "functions"], default="tools")
    parser.add_argument("--local", action="store_true", help="no server: run the embedded model in this process")
    args = parser.parse_args()

    if args.local:
        from chatcodec.tools import LocalClient

        client = LocalClient()
    else:
        import openai

        client = openai.OpenAI(base_url=args.url, api_key="none")
    model = args.model or ("local" if args.local else client.models.list().data[0].id)
    transcript = Toolbox(TOOLS).run(
        client,
        [{"role": "user", "content": QUESTION}],
        model=model,
        style=args.style,
        tool_choice=tool_choice(args.style),
        temperature=0,
        on_round=lambda r: print(f"round {r.index + 1}: {[(x.name, x.arguments) for x in r.results]}"),
    )
    print(json.dumps(transcript, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
