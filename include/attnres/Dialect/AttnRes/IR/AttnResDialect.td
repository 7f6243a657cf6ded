//===- AttnResDialect.td - the attnres dialect --------------*- tablegen -*-===//

#ifndef ATTNRES_DIALECT_ATTNRES_IR_ATTNRESDIALECT_TD
#define ATTNRES_DIALECT_ATTNRES_IR_ATTNRESDIALECT_TD

include "mlir/IR/OpBase.td"

def AttnRes_Dialect : Dialect {
  let name = "attnres";
  let cppNamespace = "::mlir::attnres";
  let summary = "Attention Residuals: a learned softmax over earlier layer outputs";
  let description = [{
    Attention Residuals (AttnRes) replace the fixed residual sum of a
    Transformer with an input-dependent softmax over earlier layer outputs,
    the *sources*. For every token, with `L` sources `v_s` of width `D`, a
    learned query `q` of rank `R` (the key of a source is its last `R`
    coordinates), an optional key-norm weight `g` and an optional output-norm
    weight `h`:

    ```
    t_s   = v_s[D-R : D]
    rho_s = 1 / sqrt(mean(t_s^2) + eps)
    z_s   = scale * <rho_s * t_s * g, q>
    lse   = log(sum_s exp(z_s))
    o_pre = sum_s exp(z_s - lse) * v_s
    o     = o_pre                                  (without h)
    o     = o_pre / sqrt(mean(o_pre^2) + eps) * h  (with h)
    ```

    The dialect has three ops on ranked tensors:

    * `attnres.forward` computes `o` and the log-sum-exp `lse` (and, when
      asked to, the pre-norm output `o_pre` that makes the backward
      single-pass);
    * `attnres.backward` computes the gradients of the sources, the query and
      the two weights;
    * `attnres.partition_reduce` merges partial results: a `softmax` merge of
      partial outputs by their log-sum-exps (split over sources,
      flash-decoding style) or a fixed-order FP32 `sum` (the finalize step of
      a split reduction over tokens).

    The residual of a 16-bit `o_pre` (`save(o_pre_residual)`): rounding the
    FP32 `o_pre` to `bf16` loses up to half a unit in the last place (ulp),
    2^-9 relative, and the backward's `delta = <do_pre, o_pre>` cancels
    against `<do_pre, v_s>`, which magnifies that loss in the gradients. The
    residual keeps 4 more bits of every element: a signed value
    `n` in [-7, 7] with

    ```
    o_pre ~= x + n * ulp(x) / 14     x = o_pre rounded to bf16 or f16
    ulp(x) = 2^(e - p)               x = 1.f * 2^e as an FP32 number,
                                     p = 7 (bf16) or 10 (f16) fraction bits
    n = round(clamp((o_pre - x) / ulp(x) * 14, -7, 7)),
        0 where x is zero, FP32-subnormal, not finite or |x| >= 2^127
    ```

    (`round` to nearest, ties to even)

    stored two to a byte in an `i8` tensor whose last dimension is `D / 2`:
    byte `j` holds element `2j` in its low four bits and element `2j + 1` in
    its high four bits, each in two's complement. That is 14 times the
    precision of `x` for a quarter of its bytes.

    Values are `bf16`, `f16` or `f32`; accumulation is always FP32, and
    `lse`, statistics and partials are `f32`. Token dimensions (everything
    between the source index and the width) may be dynamic; `L`, `D`, `R`
    and the query count `M` are static.
  }];
  // Canonicalization patterns build arith and tensor ops.
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::tensor::TensorDialect"];
}

class AttnRes_Op<string mnemonic, list<Trait> traits = []>
    : Op<AttnRes_Dialect, mnemonic, traits>;

#endif // ATTNRES_DIALECT_ATTNRES_IR_ATTNRESDIALECT_TD
