"""`xgrad info`: every plugin, its devices and renderers, what is available and why not, the default device and the
knobs that differ from their defaults. `--json` prints the same as one JSON object."""

from __future__ import annotations

import json
import platform
from typing import Any

from xgrad.device import Device
from xgrad.errors import DeviceError
from xgrad.helpers import changed_knobs
from xgrad.plugin import PLUGIN_API_VERSION, get_registry
from xgrad.version import __version__


def collect_info() -> dict[str, Any]:
    """Everything `xgrad info` shows, as plain JSON-able data."""
    registry = get_registry()
    plugins = []
    for record in registry.plugins:
        devices = []
        for name in record.devices:
            spec = registry.devices[name][0]
            available, reason = registry.device_available(name)
            devices.append(
                {
                    "name": name,
                    "priority": spec.priority,
                    "runs_kernels": spec.runs_kernels,
                    "available": available,
                    "reason": reason,
                    "description": spec.description,
                }
            )
        renderers = []
        for name in record.renderers:
            rspec = registry.renderers[name][0]
            available, reason = registry.renderer_available(name)
            renderers.append(
                {
                    "name": name,
                    "default_arch": rspec.default_arch,
                    "available": available,
                    "reason": reason,
                    "description": rspec.description,
                }
            )
        plugins.append(
            {
                "name": record.name,
                "module": record.module,
                "source": record.source,
                "distribution": record.dist_name,
                "version": record.dist_version,
                "status": record.status,
                "reason": record.reason,
                "api_version": record.api_version,
                "problems": record.problems,
                "devices": devices,
                "renderers": renderers,
            }
        )
    try:
        default, default_error = Device.DEFAULT, None
    except DeviceError as e:
        default, default_error = None, str(e)
    return {
        "xgrad_version": __version__,
        "python": platform.python_version(),
        "plugin_api_version": PLUGIN_API_VERSION,
        "plugins": plugins,
        "default_device": default,
        "default_device_error": default_error,
        "changed_knobs": changed_knobs(),
    }


def format_info(info: dict[str, Any]) -> str:
    """The human-readable report of `collect_info()`."""
    lines = [
        f"xgrad {info['xgrad_version']} (plugin API {info['plugin_api_version']}, Python {info['python']})",
        "",
        "plugins:",
    ]
    for p in info["plugins"]:
        dist = f"{p['distribution']} {p['version']}" if p["distribution"] else "no distribution"
        status = p["status"] if p["status"] == "loaded" else f"{p['status'].upper()}: {p['reason']}"
        lines.append(f"  {p['name']} [{dist}, {p['source']}, module {p['module']}]: {status}")
        for d in p["devices"]:
            kind = "runs kernels" if d["runs_kernels"] else "runs no kernels"
            state = "available" if d["available"] else f"unavailable: {d['reason']}"
            lines.append(f"    device   {d['name']:<8} priority {d['priority']:<3} {kind:<15} {state}")
        for r in p["renderers"]:
            arch = f"default arch {r['default_arch']}" if r["default_arch"] else "no default arch"
            state = "available" if r["available"] else f"unavailable: {r['reason']}"
            lines.append(f"    renderer {r['name']:<8} {arch:<35} {state}")
        lines += [f"    problem: {problem}" for problem in p["problems"]]
    lines.append("")
    if info["default_device"] is not None:
        lines.append(f"default device: {info['default_device']}")
    else:
        lines.append(f"default device: none: {info['default_device_error']}")
    knobs = info["changed_knobs"]
    lines.append("changed knobs: " + (", ".join(f"{k}={v!r}" for k, v in knobs.items()) if knobs else "none"))
    return "\n".join(lines)


def main(as_json: bool = False) -> int:
    info = collect_info()
    print(json.dumps(info, indent=2) if as_json else format_info(info))
    return 0
