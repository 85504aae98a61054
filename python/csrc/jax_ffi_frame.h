/* Reading an XLA FFI call frame from plain C: buffers, scalar attributes, errors and the
 * metadata query, against the C API header that jaxlib ships (xla/ffi/api/c_api.h). The
 * C++ wrappers in that folder do the same with templates; flashattn stays C11. */
#ifndef FA_JAX_FFI_FRAME_H
#define FA_JAX_FFI_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"
#include "xla/ffi/api/c_api.h"

/* One argument or result buffer: its data, element type and dims (row-major). */
typedef struct {
    void *data;
    XLA_FFI_DataType dtype;
    int64_t rank;
    const int64_t *dims;
} fj_buffer;

/* An error for XLA to raise (the message is copied). */
XLA_FFI_Error *fj_error(const XLA_FFI_Api *api, XLA_FFI_Error_Code code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* The XLA FFI API version the handlers answer XLA's metadata query with (jax_ffi_frame.c):
 * the lowest one they need, which every jaxlib from 0.5 accepts. A header of another major
 * version may lay the structs out differently: such a build stops here. */
#define FJ_FFI_API_MAJOR 0
#define FJ_FFI_API_MINOR 1
#if XLA_FFI_API_MAJOR != FJ_FFI_API_MAJOR || XLA_FFI_API_MINOR < FJ_FFI_API_MINOR
#error "jaxlib's XLA FFI headers are of an API version this handler was not written for"
#endif

/* FJ_FFI_API_MAJOR * 1000 + FJ_FFI_API_MINOR (exported: flashattn.jax compares it with the
 * installed jaxlib's at import). */
int fa_jax_ffi_api_version(void);

/* Checks the frame's struct size and stage. When XLA only asks for the handler's metadata
 * (the API version the handler speaks), answers it and sets *answered. */
XLA_FFI_Error *fj_begin(XLA_FFI_CallFrame *frame, int *answered);

/* Argument or result number i, named for error messages. */
XLA_FFI_Error *fj_arg(const XLA_FFI_CallFrame *frame, int64_t i, const char *name, fj_buffer *out);
XLA_FFI_Error *fj_ret(const XLA_FFI_CallFrame *frame, int64_t i, const char *name, fj_buffer *out);

/* Required scalar attributes of one element type (i64 or f32). */
XLA_FFI_Error *fj_attr_i64(const XLA_FFI_CallFrame *frame, const char *name, int64_t *out);
XLA_FFI_Error *fj_attr_f32(const XLA_FFI_CallFrame *frame, const char *name, float *out);

const char *fj_dtype_name(XLA_FFI_DataType t);

/* Bytes per element of the types the handlers take (f16, bf16: 2; f32, s32: 4). */
size_t fj_elem_bytes(XLA_FFI_DataType t);

/* Dropout's fa_problem.dropout_batch0 for the call of flattened (row-major) leading index i
 * of lead_dims[0..n) under jax.vmap, the seed's leading dims seed_dims (each 1 or the full
 * size): batch times i's index over the dims where the seed is 1 alone. Indices that share a
 * seed (differ only along those dims) so draw at distinct b, the masks one call over all of
 * them would draw; indices whose seeds differ need not. With the seed mapped nowhere that is
 * i * batch, everywhere 0. One rule for the dense and the packed handlers. */
int64_t fj_dropout_batch0(const int64_t *lead_dims, const int64_t *seed_dims, int64_t n, int64_t i, int64_t batch);

/* The library's failure s (and fa_last_error()) as an XLA error of the matching code:
 * bad arguments INVALID_ARGUMENT, unsupported UNIMPLEMENTED, memory RESOURCE_EXHAUSTED. */
XLA_FFI_Error *fj_library_error(const XLA_FFI_Api *api, fa_status s);

#endif /* FA_JAX_FFI_FRAME_H */
