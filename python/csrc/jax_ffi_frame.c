/* Reading an XLA FFI call frame from plain C (see jax_ffi_frame.h). */
#include "jax_ffi_frame.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

XLA_FFI_Error *fj_error(const XLA_FFI_Api *api, XLA_FFI_Error_Code code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    XLA_FFI_Error_Create_Args args;
    memset(&args, 0, sizeof args);
    args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
    args.message = msg; /* XLA copies it */
    args.errc = code;
    return api->XLA_FFI_Error_Create(&args);
}

/* XLA asks each handler, once, which FFI API version it speaks, by passing a frame whose
 * extension chain starts with a metadata extension. The answer is the lowest version the
 * handlers need (FJ_FFI_API_MAJOR.FJ_FFI_API_MINOR), not the headers' own: the structs they
 * read (call frame, buffers, scalars, errors, the stream and device-memory calls) are the
 * same in every header from 0.1 on, and XLA refuses a version it does not know. jaxlib 0.5
 * to 0.8 accept 0.1 only, 0.9 accepts 0.1 to 0.2, 0.10 0.1 to 0.3: answering the headers'
 * 0.3 (jaxlib 0.10's, what an unpinned build gets) made every older jaxlib refuse the
 * registration, and with it JAX's CPU backend ("Unable to initialize backend 'cpu'"). */
static XLA_FFI_Error *answer_metadata(const XLA_FFI_Api *api, XLA_FFI_Metadata_Extension *ext) {
    if (ext->extension_base.struct_size < XLA_FFI_Metadata_Extension_STRUCT_SIZE ||
        ext->metadata == NULL || ext->metadata->struct_size < XLA_FFI_Metadata_STRUCT_SIZE)
        return fj_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                        "flashattn: XLA's FFI metadata struct is older than the headers it was built with");
    ext->metadata->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    ext->metadata->api_version.extension_start = NULL;
    ext->metadata->api_version.major_version = FJ_FFI_API_MAJOR;
    ext->metadata->api_version.minor_version = FJ_FFI_API_MINOR;
    ext->metadata->traits = 0; /* plans and allocates per call: not command-buffer safe */
    /* The fields past traits that both these headers and XLA's struct have (state_type_id,
     * from the 0.8 headers on) zeroed: no state (XLA_FFI_UNKNOWN_TYPE_ID). Not named, so the
     * 0.5 to 0.7 headers, which lack it, build this file too. */
    size_t known = offsetof(XLA_FFI_Metadata, traits) + sizeof(XLA_FFI_Handler_Traits);
    size_t end = ext->metadata->struct_size < sizeof(XLA_FFI_Metadata) ? ext->metadata->struct_size
                                                                       : sizeof(XLA_FFI_Metadata);
    if (end > known) memset((char *)ext->metadata + known, 0, end - known);
    return NULL;
}

#if defined(__GNUC__)
__attribute__((visibility("default")))
#endif
int fa_jax_ffi_api_version(void) {
    return FJ_FFI_API_MAJOR * 1000 + FJ_FFI_API_MINOR;
}

XLA_FFI_Error *fj_begin(XLA_FFI_CallFrame *frame, int *answered) {
    *answered = 0;
    if (frame->struct_size < XLA_FFI_CallFrame_STRUCT_SIZE)
        return fj_error(frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                        "flashattn: XLA's FFI call frame is older than the headers it was built with "
                        "(size %zu < %zu)",
                        frame->struct_size, (size_t)XLA_FFI_CallFrame_STRUCT_SIZE);
    if (frame->extension_start != NULL && frame->extension_start->type == XLA_FFI_Extension_Metadata) {
        *answered = 1;
        return answer_metadata(frame->api, (XLA_FFI_Metadata_Extension *)frame->extension_start);
    }
    if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE)
        return fj_error(frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                        "flashattn: handler called at stage %d, it only executes", (int)frame->stage);
    return NULL;
}

static XLA_FFI_Error *take_buffer(const XLA_FFI_CallFrame *frame, int is_arg, int64_t i,
                                  const char *name, fj_buffer *out) {
    const char *what = is_arg ? "argument" : "result";
    int64_t n = is_arg ? frame->args.size : frame->rets.size;
    if (i >= n)
        return fj_error(frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                        "flashattn: %s %lld (%s) is missing: the call has %lld", what, (long long)i,
                        name, (long long)n);
    int type = is_arg ? (int)frame->args.types[i] : (int)frame->rets.types[i];
    if (type != 1 /* XLA_FFI_ArgType_BUFFER == XLA_FFI_RetType_BUFFER */)
        return fj_error(frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                        "flashattn: %s %lld (%s) is not a buffer", what, (long long)i, name);
    const XLA_FFI_Buffer *b = (const XLA_FFI_Buffer *)(is_arg ? frame->args.args[i] : frame->rets.rets[i]);
    out->data = b->data;
    out->dtype = b->dtype;
    out->rank = b->rank;
    out->dims = b->dims;
    return NULL;
}

XLA_FFI_Error *fj_arg(const XLA_FFI_CallFrame *frame, int64_t i, const char *name, fj_buffer *out) {
    return take_buffer(frame, 1, i, name, out);
}

XLA_FFI_Error *fj_ret(const XLA_FFI_CallFrame *frame, int64_t i, const char *name, fj_buffer *out) {
    return take_buffer(frame, 0, i, name, out);
}

/* The scalar attribute called name, checked to hold element type want. */
static XLA_FFI_Error *find_scalar(const XLA_FFI_CallFrame *frame, const char *name,
                                  XLA_FFI_DataType want, const void **value) {
    size_t len = strlen(name);
    for (int64_t i = 0; i < frame->attrs.size; i++) {
        const XLA_FFI_ByteSpan *n = frame->attrs.names[i];
        if (n->len != len || memcmp(n->ptr, name, len) != 0) continue;
        const XLA_FFI_Scalar *s = (const XLA_FFI_Scalar *)frame->attrs.attrs[i];
        if (frame->attrs.types[i] != XLA_FFI_AttrType_SCALAR || s->dtype != want)
            return fj_error(frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                            "flashattn: attribute %s must be a %s scalar", name, fj_dtype_name(want));
        *value = s->value;
        return NULL;
    }
    return fj_error(frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    "flashattn: attribute %s is missing", name);
}

XLA_FFI_Error *fj_attr_i64(const XLA_FFI_CallFrame *frame, const char *name, int64_t *out) {
    const void *v = NULL;
    XLA_FFI_Error *e = find_scalar(frame, name, XLA_FFI_DataType_S64, &v);
    if (!e) memcpy(out, v, sizeof *out);
    return e;
}

XLA_FFI_Error *fj_attr_f32(const XLA_FFI_CallFrame *frame, const char *name, float *out) {
    const void *v = NULL;
    XLA_FFI_Error *e = find_scalar(frame, name, XLA_FFI_DataType_F32, &v);
    if (!e) memcpy(out, v, sizeof *out);
    return e;
}

const char *fj_dtype_name(XLA_FFI_DataType t) {
    switch (t) {
    case XLA_FFI_DataType_F32: return "float32";
    case XLA_FFI_DataType_F16: return "float16";
    case XLA_FFI_DataType_BF16: return "bfloat16";
    case XLA_FFI_DataType_F64: return "float64";
    case XLA_FFI_DataType_S32: return "int32";
    case XLA_FFI_DataType_U32: return "uint32";
    case XLA_FFI_DataType_S64: return "int64";
    case XLA_FFI_DataType_S8: return "int8";
    case XLA_FFI_DataType_F8E4M3FN: return "float8_e4m3fn";
    default: return "another type";
    }
}

size_t fj_elem_bytes(XLA_FFI_DataType t) {
    if (t == XLA_FFI_DataType_S8 || t == XLA_FFI_DataType_U8 || t == XLA_FFI_DataType_F8E4M3FN) return 1;
    return t == XLA_FFI_DataType_F16 || t == XLA_FFI_DataType_BF16 ? 2 : 4;
}

XLA_FFI_Error *fj_library_error(const XLA_FFI_Api *api, fa_status s) {
    XLA_FFI_Error_Code code = XLA_FFI_Error_Code_INTERNAL;
    if (s == FA_ERR_INVALID || s == FA_ERR_NULL || s == FA_ERR_OVERFLOW) code = XLA_FFI_Error_Code_INVALID_ARGUMENT;
    if (s == FA_ERR_UNSUPPORTED) code = XLA_FFI_Error_Code_UNIMPLEMENTED;
    if (s == FA_ERR_NO_MEMORY) code = XLA_FFI_Error_Code_RESOURCE_EXHAUSTED;
    return fj_error(api, code, "flashattn: %s (%s)", fa_last_error(), fa_status_string(s));
}

int64_t fj_dropout_batch0(const int64_t *lead_dims, const int64_t *seed_dims, int64_t n, int64_t i, int64_t batch) {
    int64_t shared = 0, scale = 1;
    for (int64_t j = n - 1; j >= 0; j--) {
        const int64_t m = i % lead_dims[j];
        i /= lead_dims[j];
        if (seed_dims[j] == 1) shared += m * scale, scale *= lead_dims[j];
    }
    return shared * batch;
}
