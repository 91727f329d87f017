"""The C API of include/kiln.h as ctypes declarations: structs field for field
in the header's order, and one prototype per function the package calls.

A struct here must match its C twin byte for byte; tests/test_abi.py compiles
the header and compares sizes and offsets.
"""
from __future__ import annotations

import ctypes
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int,
                    c_int64, c_size_t, c_void_p)
from typing import Optional

from . import _library

c_status = c_int
c_enum = c_int


class FormatInfo(Structure):
    _fields_ = [("name", c_char_p), ("desc", c_char_p), ("block", c_int), ("block_bytes", c_int),
                ("k_multiple", c_int), ("bits_per_weight", c_double), ("scale_type", c_enum),
                ("scale_rows", c_int), ("scale_cols", c_int), ("has_global_scale", c_int),
                ("gguf_type", c_int), ("scale_desc", c_char_p), ("grouped", c_int),
                ("zero_point", c_int)]


class QTensor(Structure):
    _fields_ = [("format", c_enum), ("n", c_int64), ("k", c_int64), ("data", c_void_p),
                ("scale", c_void_p), ("global_scale", c_float), ("group", c_int64)]


class Target(Structure):
    _fields_ = [("name", c_char * 16), ("sm", c_int), ("arch_specific", c_int),
                ("mma_bf16", c_int), ("mma_fp8", c_int), ("wgmma", c_int), ("tma", c_int),
                ("smem_optin", c_int), ("sm_count", c_int), ("alias_of", c_char * 16)]


class PlanOptions(Structure):
    _fields_ = [("backend", c_char_p), ("strict_backend", c_int), ("capture", POINTER(c_int64)),
                ("n_capture", c_int), ("max_tokens", c_int64), ("no_fuse", c_int),
                ("tuning", c_void_p)]


class PlanLinear(Structure):
    _fields_ = [("node", c_char_p), ("format", c_enum), ("n", c_int64), ("k", c_int64),
                ("backend", c_char_p), ("act", c_char_p), ("epilogue", c_char_p),
                ("signature", c_int), ("refused", c_char_p), ("fell_back", c_int),
                ("input_scale", c_float), ("input_scale_use", c_char_p),
                ("variant", c_char_p), ("tuned", c_int)]


ON_CORRUPT = CFUNCTYPE(None, c_void_p, c_char_p)


class CacheOptions(Structure):
    _fields_ = [("shipped", POINTER(c_char_p)), ("n_shipped", c_int), ("path", c_char_p),
                ("no_writable", c_int), ("map_size", c_size_t), ("strict", c_int),
                ("on_corrupt", ON_CORRUPT), ("ctx", c_void_p), ("offline", c_int)]


class CompileOptions(Structure):
    _fields_ = [("cache", CacheOptions), ("jobs", c_int), ("keep_source", c_char_p),
                ("quiet", c_int), ("plan", PlanOptions), ("compile_timeout_s", c_double),
                ("stop", c_void_p)]


class CompileResult(Structure):
    _fields_ = [("signatures", c_int), ("cached", c_int), ("compiled", c_int),
                ("seconds", c_double), ("writable", c_int)]


class SessionOptions(Structure):
    _fields_ = [("device", c_int), ("cache", CacheOptions), ("eager", c_int), ("quiet", c_int),
                ("target", POINTER(Target)), ("plan", PlanOptions)]


class SessionStats(Structure):
    _fields_ = [("device", c_char * 128), ("target", c_char * 16), ("kernels", c_int),
                ("cached", c_int), ("compiled", c_int), ("plan_s", c_double),
                ("cache_s", c_double), ("module_s", c_double), ("weights_s", c_double),
                ("graphs_s", c_double), ("weight_bytes", c_size_t), ("arena_bytes", c_size_t),
                ("compile_s", c_double), ("load_read_bytes", c_size_t),
                ("load_copied_bytes", c_size_t), ("load_packed_bytes", c_size_t),
                ("load_s", c_double), ("load_threads", c_int), ("load_pinned", c_int),
                ("load_device_packed_bytes", c_size_t), ("load_device_pack_s", c_double)]


class DeviceMatrix(Structure):
    _fields_ = [("ptr", ctypes.c_uint64), ("stride", c_int64)]


class CpuOptions(Structure):
    _fields_ = [("threads", c_int)]


class ModelOptions(Structure):
    _fields_ = [("allow_nonfinite", c_int), ("allow_partial", c_int)]


class ModelInfo(Structure):
    _fields_ = [(f, c_int64) for f in ("n_layers", "d_model", "d_ffn", "n_heads", "n_kv_heads",
                                       "vocab", "ctx")] + [("rms_eps", c_float)]


class ModelTensorInfo(Structure):
    _fields_ = [("name", c_char_p), ("type_name", c_char_p), ("supported", c_int),
                ("format", c_enum), ("n_dims", c_int), ("ne", c_int64 * 4), ("bytes", c_size_t),
                ("group", c_int64), ("input_scale", c_float)]


#: Every struct above by its C name, for the layout test.
STRUCTS = {
    "kiln_format_info": FormatInfo, "kiln_qtensor": QTensor, "kiln_target": Target,
    "kiln_plan_options": PlanOptions, "kiln_plan_linear": PlanLinear,
    "kiln_cache_options": CacheOptions, "kiln_compile_options": CompileOptions,
    "kiln_compile_result": CompileResult, "kiln_session_options": SessionOptions,
    "kiln_session_stats": SessionStats, "kiln_device_matrix": DeviceMatrix,
    "kiln_cpu_options": CpuOptions,
    "kiln_model_options": ModelOptions, "kiln_model_info": ModelInfo,
    "kiln_model_tensor_info": ModelTensorInfo,
}

P = c_void_p
PP = POINTER(c_void_p)
FLOATS = POINTER(c_void_p)  # const float *const *: an array of buffer addresses

_PROTOTYPES = [
    ("kiln_version", [], c_char_p),
    ("kiln_strerror", [c_status], c_char_p),
    ("kiln_last_error", [], c_char_p),
    ("kiln_format_get", [c_enum], POINTER(FormatInfo)),
    ("kiln_format_from_name", [c_char_p, POINTER(c_enum)], c_status),
    ("kiln_format_data_bytes", [c_enum, c_int64, c_int64, POINTER(c_size_t)], c_status),
    ("kiln_format_scale_bytes", [c_enum, c_int64, c_int64, POINTER(c_size_t)], c_status),
    ("kiln_qtensor_scale_bytes", [POINTER(QTensor), POINTER(c_size_t)], c_status),
    ("kiln_quantize", [c_void_p, POINTER(QTensor)], c_status),
    ("kiln_dequantize", [POINTER(QTensor), c_void_p], c_status),
    ("kiln_op_name", [c_enum], c_char_p),
    ("kiln_graph_create", [PP], c_status),
    ("kiln_graph_destroy", [P], None),
    ("kiln_graph_input", [P, c_char_p, c_int64, PP], c_status),
    ("kiln_graph_weight", [P, c_char_p, POINTER(QTensor), PP], c_status),
    ("kiln_graph_param", [P, c_char_p, c_int64, c_void_p, PP], c_status),
    ("kiln_graph_linear", [P, c_char_p, P, P, P, PP], c_status),
    ("kiln_graph_linear_input_scale", [P, P, c_float], c_status),
    ("kiln_graph_add", [P, c_char_p, P, P, PP], c_status),
    ("kiln_graph_mul", [P, c_char_p, P, P, PP], c_status),
    ("kiln_graph_silu", [P, c_char_p, P, PP], c_status),
    ("kiln_graph_gelu", [P, c_char_p, P, PP], c_status),
    ("kiln_graph_rms_norm", [P, c_char_p, P, P, c_float, PP], c_status),
    ("kiln_graph_output", [P, P], c_status),
    ("kiln_graph_n_tensors", [P], c_int),
    ("kiln_graph_tensor", [P, c_int], P),
    ("kiln_graph_n_inputs", [P], c_int),
    ("kiln_graph_input_at", [P, c_int], P),
    ("kiln_graph_n_outputs", [P], c_int),
    ("kiln_graph_output_at", [P, c_int], P),
    ("kiln_graph_find", [P, c_char_p], P),
    ("kiln_tensor_name", [P], c_char_p),
    ("kiln_tensor_op", [P], c_enum),
    ("kiln_tensor_ne", [P, c_int], c_int64),
    ("kiln_tensor_weight", [P], POINTER(QTensor)),
    ("kiln_tensor_input_scale", [P], c_float),
    ("kiln_tensor_src", [P, c_int], P),
    ("kiln_target_from_name", [c_char_p, POINTER(Target)], c_status),
    ("kiln_target_live", [c_int, POINTER(Target)], c_status),
    ("kiln_target_names", [], POINTER(c_char_p)),
    ("kiln_plan_create", [P, POINTER(Target), POINTER(PlanOptions), PP], c_status),
    ("kiln_plan_destroy", [P], None),
    ("kiln_plan_n_buckets", [P], c_int),
    ("kiln_plan_bucket", [P, c_int], c_int64),
    ("kiln_plan_bucket_for", [P, c_int64], c_int),
    ("kiln_plan_n_linears", [P], c_int),
    ("kiln_plan_linear_at", [P, c_int, c_int, POINTER(PlanLinear)], c_status),
    ("kiln_plan_n_signatures", [P], c_int),
    ("kiln_plan_signature", [P, c_int], c_char_p),
    ("kiln_plan_warnings", [P], POINTER(c_char_p)),
    ("kiln_plan_arena_bytes", [P, c_int], c_size_t),
    ("kiln_plan_weight_bytes", [P, POINTER(c_size_t), POINTER(c_size_t)], c_status),
    ("kiln_cache_default_path", [c_char_p, c_size_t], c_status),
    ("kiln_cache_open", [POINTER(CacheOptions), PP], c_status),
    ("kiln_cache_close", [P], None),
    ("kiln_cache_export", [P, P, c_char_p, c_int], c_status),
    ("kiln_compile", [P, POINTER(Target), POINTER(CompileOptions), POINTER(CompileResult)],
     c_status),
    ("kiln_compile_plan", [P, POINTER(CompileOptions), POINTER(CompileResult)], c_status),
    ("kiln_session_create", [P, POINTER(SessionOptions), PP], c_status),
    ("kiln_session_destroy", [P], None),
    ("kiln_session_run", [P, c_int64, FLOATS, FLOATS], c_status),
    ("kiln_session_run_device", [P, c_int64, POINTER(DeviceMatrix), POINTER(DeviceMatrix), P],
     c_status),
    ("kiln_session_find_entry", [P, c_char_p, POINTER(c_int)], c_status),
    ("kiln_session_run_entry", [P, c_int, c_int64, POINTER(DeviceMatrix), POINTER(DeviceMatrix),
                                P], c_status),
    ("kiln_session_get_stats", [P, POINTER(SessionStats)], None),
    ("kiln_session_reload", [P, P], c_status),
    ("kiln_cpu_create", [P, POINTER(CpuOptions), PP], c_status),
    ("kiln_cpu_destroy", [P], None),
    ("kiln_cpu_threads", [P], c_int),
    ("kiln_cpu_run", [P, c_int64, FLOATS, FLOATS], c_status),
    ("kiln_model_open_with", [c_char_p, POINTER(ModelOptions), PP], c_status),
    ("kiln_model_close", [P], None),
    ("kiln_model_warnings", [P], POINTER(c_char_p)),
    ("kiln_model_container", [P], c_char_p),
    ("kiln_model_arch", [P], c_char_p),
    ("kiln_model_get_info", [P, POINTER(ModelInfo)], None),
    ("kiln_model_n_tensors", [P], c_int),
    ("kiln_model_tensor_at", [P, c_int, POINTER(ModelTensorInfo)], c_status),
    ("kiln_model_n_metadata", [P], c_int),
    ("kiln_model_metadata_at", [P, c_int, c_int, POINTER(c_char_p), c_char_p, c_size_t],
     c_status),
    ("kiln_model_weight", [P, c_char_p, POINTER(QTensor)], c_status),
    ("kiln_model_build_linears", [P, P, c_int], c_status),
    ("kiln_model_build_engine", [P, P, c_int], c_status),
    ("kiln_model_build_ffn", [P, P, c_int], c_status),
]

_lib: Optional[ctypes.CDLL] = None


def lib() -> ctypes.CDLL:
    """libkiln with every prototype above declared (loaded on first use)."""
    global _lib
    if _lib is None:
        handle, _ = _library.load()
        for name, args, res in _PROTOTYPES:
            f = getattr(handle, name)
            f.argtypes = args
            f.restype = res
        _lib = handle
    return _lib


def text(b: Optional[bytes]) -> str:
    """A C string kiln returned, as str ("" for NULL)."""
    return b.decode("utf-8", errors="replace") if b else ""


def strings(p) -> list:
    """A NULL-terminated array of C strings, as a list of str."""
    out = []
    i = 0
    while p and p[i]:
        out.append(text(p[i]))
        i += 1
    return out


def encode(s) -> Optional[bytes]:
    """A str, bytes or path-like for a const char * argument (None stays NULL)."""
    return None if s is None else os.fsencode(s)
