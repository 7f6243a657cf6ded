// RUN: attnres-opt %s --split-input-file --verify-diagnostics
// Verifier rules of attnres.forward, and the source/query/weight/attribute
// rules it shares with attnres.backward (docs/DialectGuide.md).

func.func @zero_sources(%q: tensor<16xf32>) {
  // expected-error @+1 {{requires at least one source (L >= 1), got none}}
  %o, %lse = attnres.forward sources() query(%q : tensor<16xf32>)
      -> tensor<?x64xf32>, tensor<?xf32>
  return
}

// -----

func.func @zero_packed_sources(%v: tensor<0x?x64xf32>, %q: tensor<16xf32>) {
  // expected-error @+1 {{requires at least one source (L >= 1), got a packed source dimension of 0}}
  %o, %lse = attnres.forward packed(%v : tensor<0x?x64xf32>) query(%q : tensor<16xf32>)
      -> tensor<?x64xf32>, tensor<?xf32>
  return
}

// -----

func.func @sources_of_different_shapes(%a: tensor<?x64xf32>, %b: tensor<?x32xf32>, %q: tensor<16xf32>) {
  // expected-error @+1 {{source #1 has type 'tensor<?x32xf32>' but source #0 has type 'tensor<?x64xf32>': all sources must have the same shape and element type}}
  %o, %lse = attnres.forward sources(%a, %b : tensor<?x64xf32>, tensor<?x32xf32>)
      query(%q : tensor<16xf32>) -> tensor<?x64xf32>, tensor<?xf32>
  return
}

// -----

func.func @sources_of_different_element_types(%a: tensor<?x64xf32>, %b: tensor<?x64xbf16>, %q: tensor<16xf32>) {
  // expected-error @+1 {{source #1 has type 'tensor<?x64xbf16>' but source #0 has type 'tensor<?x64xf32>'}}
  %o, %lse = attnres.forward sources(%a, %b : tensor<?x64xf32>, tensor<?x64xbf16>)
      query(%q : tensor<16xf32>) -> tensor<?x64xf32>, tensor<?xf32>
  return
}

// -----

func.func @sources_static_and_dynamic(%a: tensor<8x64xf32>, %b: tensor<?x64xf32>, %q: tensor<16xf32>) {
  // expected-error @+1 {{source #1 has type 'tensor<?x64xf32>' but source #0 has type 'tensor<8x64xf32>'}}
  %o, %lse = attnres.forward sources(%a, %b : tensor<8x64xf32>, tensor<?x64xf32>)
      query(%q : tensor<16xf32>) -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @unsupported_source_type(%a: tensor<?x64xf64>, %q: tensor<16xf32>) {
  // expected-error @+1 {{source has element type 'f64'; it must be bf16, f16 or f32}}
  %o, %lse = attnres.forward sources(%a : tensor<?x64xf64>)
      query(%q : tensor<16xf32>) -> tensor<?x64xf64>, tensor<?xf32>
  return
}

// -----

func.func @integer_source_type(%a: tensor<?x64xi8>, %q: tensor<16xf32>) {
  // expected-error @+1 {{source has element type 'i8'; it must be bf16, f16 or f32}}
  %o, %lse = attnres.forward sources(%a : tensor<?x64xi8>)
      query(%q : tensor<16xf32>) -> tensor<?x64xi8>, tensor<?xf32>
  return
}

// -----

func.func @rank0_source(%a: tensor<f32>, %q: tensor<1xf32>) {
  // expected-error @+1 {{source must have rank >= 1 ([T..., D]), got 'tensor<f32>'}}
  %o, %lse = attnres.forward sources(%a : tensor<f32>)
      query(%q : tensor<1xf32>) -> tensor<f32>, tensor<f32>
  return
}

// -----

func.func @packed_rank1(%a: tensor<64xf32>, %q: tensor<16xf32>) {
  // expected-error @+1 {{packed source must have rank >= 2 ([L, T..., D]), got 'tensor<64xf32>'}}
  %o, %lse = attnres.forward packed(%a : tensor<64xf32>)
      query(%q : tensor<16xf32>) -> tensor<64xf32>, tensor<f32>
  return
}

// -----

func.func @packed_dynamic_count(%a: tensor<?x8x64xf32>, %q: tensor<16xf32>) {
  // expected-error @+1 {{packed source count L (leading dimension) must be static, got 'tensor<?x8x64xf32>'}}
  %o, %lse = attnres.forward packed(%a : tensor<?x8x64xf32>)
      query(%q : tensor<16xf32>) -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @packed_two_operands(%a: tensor<2x8x64xf32>, %q: tensor<16xf32>) {
  // expected-error @+1 {{packed sources must be exactly one tensor [L, T..., D], got 2}}
  %o, %lse = "attnres.forward"(%a, %a, %q) <{packed, operandSegmentSizes = array<i32: 2, 1, 0, 0>, resultSegmentSizes = array<i32: 1, 1, 0, 0>}>
      : (tensor<2x8x64xf32>, tensor<2x8x64xf32>, tensor<16xf32>) -> (tensor<8x64xf32>, tensor<8xf32>)
  return
}

// -----

func.func @dynamic_width(%a: tensor<8x?xf32>, %q: tensor<16xf32>) {
  // expected-error @+1 {{source width D (last dimension) must be static, got 'tensor<8x?xf32>'}}
  %o, %lse = attnres.forward sources(%a : tensor<8x?xf32>)
      query(%q : tensor<16xf32>) -> tensor<8x?xf32>, tensor<8xf32>
  return
}

// -----

func.func @query_rank3(%a: tensor<8x64xf32>, %q: tensor<1x2x16xf32>) {
  // expected-error @+1 {{query must be [R] or [M, R], got 'tensor<1x2x16xf32>'}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<1x2x16xf32>) -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @query_dynamic(%a: tensor<8x64xf32>, %q: tensor<?xf32>) {
  // expected-error @+1 {{query shape must be static (M and R are static), got 'tensor<?xf32>'}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<?xf32>) -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @rank_exceeds_width(%a: tensor<8x64xf32>, %q: tensor<65xf32>) {
  // expected-error @+1 {{query rank R = 65 exceeds the source width D = 64 (the key is the last R coordinates of a source)}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<65xf32>) -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @rank_zero(%a: tensor<8x64xf32>, %q: tensor<0xf32>) {
  // expected-error @+1 {{query rank R = 0 must be at least 1}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<0xf32>) -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @too_many_queries(%a: tensor<8x64xf32>, %q: tensor<17x64xf32>) {
  // expected-error @+1 {{query count M = 17 is out of range [1, 16]}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<17x64xf32>) -> tensor<17x8x64xf32>, tensor<17x8xf32>
  return
}

// -----

func.func @zero_queries(%a: tensor<8x64xf32>, %q: tensor<0x64xf32>) {
  // expected-error @+1 {{query count M = 0 is out of range [1, 16]}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<0x64xf32>) -> tensor<0x8x64xf32>, tensor<0x8xf32>
  return
}

// -----

func.func @unsupported_query_type(%a: tensor<8x64xf32>, %q: tensor<16xi32>) {
  // expected-error @+1 {{query has element type 'i32'; it must be bf16, f16 or f32}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<16xi32>) -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @key_norm_wrong_length(%a: tensor<8x64xf32>, %q: tensor<16xf32>, %g: tensor<64xf32>) {
  // expected-error @+1 {{key_norm weight must be [R] = [16], got 'tensor<64xf32>'}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<16xf32>) key_norm(%g : tensor<64xf32>)
      -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @key_norm_per_query(%a: tensor<8x64xf32>, %q: tensor<2x16xf32>, %g: tensor<2x16xf32>) {
  // expected-error @+1 {{key_norm weight must be [R] = [16], got 'tensor<2x16xf32>'}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<2x16xf32>) key_norm(%g : tensor<2x16xf32>)
      -> tensor<2x8x64xf32>, tensor<2x8xf32>
  return
}

// -----

func.func @key_norm_type(%a: tensor<8x64xf32>, %q: tensor<16xf32>, %g: tensor<16xf64>) {
  // expected-error @+1 {{key_norm weight has element type 'f64'; it must be bf16, f16 or f32}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<16xf32>) key_norm(%g : tensor<16xf64>)
      -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @output_norm_wrong_length(%a: tensor<8x64xf32>, %q: tensor<16xf32>, %h: tensor<16xf32>) {
  // expected-error @+1 {{output_norm weight must be [D] = [64], got 'tensor<16xf32>'}}
  %o, %lse, %o_pre = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<16xf32>) output_norm(%h : tensor<16xf32>)
      -> tensor<8x64xf32>, tensor<8xf32>, tensor<8x64xf32>
  return
}

// -----

func.func @output_norm_per_query_single_query(%a: tensor<8x64xf32>, %q: tensor<16xf32>, %h: tensor<1x64xf32>) {
  // expected-error @+1 {{output_norm weight must be [D] = [64] for a single [R] query, got 'tensor<1x64xf32>'}}
  %o, %lse, %o_pre = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<16xf32>) output_norm(%h : tensor<1x64xf32>)
      -> tensor<8x64xf32>, tensor<8xf32>, tensor<8x64xf32>
  return
}

// -----

func.func @output_norm_wrong_query_count(%a: tensor<8x64xf32>, %q: tensor<4x16xf32>, %h: tensor<3x64xf32>) {
  // expected-error @+1 {{output_norm weight must be [M, D] = [4, 64], got 'tensor<3x64xf32>'}}
  %o, %lse, %o_pre = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<4x16xf32>) output_norm(%h : tensor<3x64xf32>)
      -> tensor<4x8x64xf32>, tensor<4x8xf32>, tensor<4x8x64xf32>
  return
}

// -----

func.func @eps_zero(%a: tensor<8x64xf32>, %q: tensor<16xf32>) {
  // expected-error @+1 {{eps must be finite and > 0, got 0}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<16xf32>) {eps = 0.0 : f64} -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @eps_negative(%a: tensor<8x64xf32>, %q: tensor<16xf32>) {
  // expected-error @+1 {{eps must be finite and > 0, got -1.000000e-06}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<16xf32>) {eps = -1.0e-6 : f64} -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @eps_infinite(%a: tensor<8x64xf32>, %q: tensor<16xf32>) {
  // expected-error @+1 {{eps must be finite and > 0, got INF}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<16xf32>) {eps = 0x7FF0000000000000 : f64} -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @eps_nan(%a: tensor<8x64xf32>, %q: tensor<16xf32>) {
  // expected-error @+1 {{eps must be finite and > 0, got nan}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<16xf32>) {eps = 0x7FF8000000000000 : f64} -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @scale_infinite(%a: tensor<8x64xf32>, %q: tensor<16xf32>) {
  // expected-error @+1 {{scale must be finite, got -INF}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<16xf32>) {scale = 0xFFF0000000000000 : f64} -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @eps_not_a_float(%a: tensor<8x64xf32>, %q: tensor<16xf32>) {
  // expected-error @+2 {{attribute 'eps' failed to satisfy constraint: 64-bit float attribute}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<16xf32>) {eps = 1 : i64} -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @output_shape(%a: tensor<8x64xf32>, %q: tensor<16xf32>) {
  // expected-error @+1 {{output must be [T..., D] = [8, 64], got 'tensor<8x32xf32>'}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<16xf32>) -> tensor<8x32xf32>, tensor<8xf32>
  return
}

// -----

func.func @output_missing_query_dim(%a: tensor<8x64xf32>, %q: tensor<2x16xf32>) {
  // expected-error @+1 {{output must be [M, T..., D] = [2, 8, 64], got 'tensor<8x64xf32>'}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<2x16xf32>) -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @output_element_type(%a: tensor<8x64xbf16>, %q: tensor<16xf32>) {
  // expected-error @+1 {{output element type must be the source element type 'bf16' or f32 (an FP32 partial), got 'f16'}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xbf16>)
      query(%q : tensor<16xf32>) -> tensor<8x64xf16>, tensor<8xf32>
  return
}

// -----

func.func @lse_not_f32(%a: tensor<8x64xbf16>, %q: tensor<16xf32>) {
  // expected-error @+1 {{lse must have element type 'f32', got 'tensor<8xbf16>'}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xbf16>)
      query(%q : tensor<16xf32>) -> tensor<8x64xbf16>, tensor<8xbf16>
  return
}

// -----

func.func @lse_shape(%a: tensor<?x64xbf16>, %q: tensor<3x16xf32>) {
  // expected-error @+1 {{lse must be [M, T...] = [3, ?], got 'tensor<?xf32>'}}
  %o, %lse = attnres.forward sources(%a : tensor<?x64xbf16>)
      query(%q : tensor<3x16xf32>) -> tensor<3x?x64xbf16>, tensor<?xf32>
  return
}

// -----

func.func @o_pre_missing(%a: tensor<8x64xf32>, %q: tensor<16xf32>, %h: tensor<64xf32>) {
  // expected-error @+1 {{with save(o_pre) and an output norm, the forward must return o_pre as its third result}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<16xf32>) output_norm(%h : tensor<64xf32>)
      -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @o_pre_without_output_norm(%a: tensor<8x64xf32>, %q: tensor<16xf32>) {
  // expected-error @+1 {{o_pre is a result only with save(o_pre) or save(o_pre_residual) and an output norm (without an output norm, o is o_pre)}}
  %o, %lse, %o_pre = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<16xf32>) -> tensor<8x64xf32>, tensor<8xf32>, tensor<8x64xf32>
  return
}

// -----

func.func @o_pre_with_save_lse(%a: tensor<8x64xf32>, %q: tensor<16xf32>, %h: tensor<64xf32>) {
  // expected-error @+1 {{o_pre is a result only with save(o_pre) or save(o_pre_residual) and an output norm}}
  %o, %lse, %o_pre = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<16xf32>) output_norm(%h : tensor<64xf32>) save(lse)
      -> tensor<8x64xf32>, tensor<8xf32>, tensor<8x64xf32>
  return
}

// -----

func.func @o_pre_type(%a: tensor<8x64xbf16>, %q: tensor<16xf32>, %h: tensor<64xf32>) {
  // expected-error @+1 {{o_pre must have the type of the output 'tensor<8x64xbf16>', got 'tensor<8x64xf32>'}}
  %o, %lse, %o_pre = attnres.forward sources(%a : tensor<8x64xbf16>)
      query(%q : tensor<16xf32>) output_norm(%h : tensor<64xf32>)
      -> tensor<8x64xbf16>, tensor<8xf32>, tensor<8x64xf32>
  return
}

// -----

func.func @unknown_save_mode(%a: tensor<8x64xf32>, %q: tensor<16xf32>) {
  // expected-error @+2 {{expected string or keyword containing one of the following enum values for attribute 'save' [o_pre, lse, o_pre_residual]}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<16xf32>) save(everything) -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @unranked_source(%a: tensor<*xf32>, %q: tensor<16xf32>) {
  // expected-error @+1 {{must be variadic of ranked tensor of any type values}}
  %o, %lse = attnres.forward sources(%a : tensor<*xf32>)
      query(%q : tensor<16xf32>) -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @source_type_count(%a: tensor<8x64xf32>, %q: tensor<16xf32>) {
  // expected-error @+1 {{expected one type for all 3 sources or one type per source, got 2}}
  %o, %lse = attnres.forward sources(%a, %a, %a : tensor<8x64xf32>, tensor<8x64xf32>)
      query(%q : tensor<16xf32>) -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @dynamic_output_width(%v: tensor<?x64xbf16>, %q: tensor<16xbf16>) {
  // expected-error @+1 {{output must be [T..., D] = [?, 64], got 'tensor<?x?xbf16>': dimension 1 must be static (the op's other operands fix it to 64)}}
  %o, %lse = attnres.forward sources(%v : tensor<?x64xbf16>) query(%q : tensor<16xbf16>) -> tensor<?x?xbf16>, tensor<?xf32>
  return
}

// -----

func.func @too_many_sources(%v: tensor<4097x?x64xbf16>, %q: tensor<16xbf16>) {
  // expected-error @+1 {{source count L = 4097 is out of range [1, 4096]}}
  %o, %lse = attnres.forward packed(%v : tensor<4097x?x64xbf16>) query(%q : tensor<16xbf16>) -> tensor<?x64xbf16>, tensor<?xf32>
  return
}

// -----

func.func @too_wide(%v: tensor<?x65537xbf16>, %q: tensor<16xbf16>) {
  // expected-error @+1 {{source width D = 65537 is out of range [1, 65536]}}
  %o, %lse = attnres.forward sources(%v : tensor<?x65537xbf16>) query(%q : tensor<16xbf16>) -> tensor<?x65537xbf16>, tensor<?xf32>
  return
}

// -----

func.func @residual_missing(%a: tensor<8x64xbf16>, %q: tensor<16xf32>) {
  // expected-error @+1 {{with save(o_pre_residual), the forward must return the residual of o_pre (i8, [M?, T..., D/2]) as its last result}}
  %o, %lse = attnres.forward sources(%a : tensor<8x64xbf16>)
      query(%q : tensor<16xf32>) save(o_pre_residual) -> tensor<8x64xbf16>, tensor<8xf32>
  return
}

// -----

func.func @residual_without_save_mode(%a: tensor<8x64xbf16>, %q: tensor<16xf32>) {
  // expected-error @+1 {{the o_pre residual is a result only with save(o_pre_residual)}}
  %o, %lse, %r = attnres.forward sources(%a : tensor<8x64xbf16>)
      query(%q : tensor<16xf32>) -> tensor<8x64xbf16>, tensor<8xf32>, tensor<8x32xi8>
  return
}

// -----

func.func @residual_o_pre_missing(%a: tensor<8x64xbf16>, %q: tensor<16xf32>, %h: tensor<64xf32>) {
  // expected-error @+1 {{with save(o_pre_residual) and an output norm, the forward must return o_pre as its third result}}
  %o, %lse, %r = attnres.forward sources(%a : tensor<8x64xbf16>)
      query(%q : tensor<16xf32>) output_norm(%h : tensor<64xf32>) save(o_pre_residual)
      -> tensor<8x64xbf16>, tensor<8xf32>, tensor<8x32xi8>
  return
}

// -----

func.func @residual_of_f32(%a: tensor<8x64xf32>, %q: tensor<16xf32>) {
  // expected-error @+1 {{the o_pre residual is the residual of a 16-bit o_pre (bf16 or f16), but o_pre is 'tensor<8x64xf32>'}}
  %o, %lse, %r = attnres.forward sources(%a : tensor<8x64xf32>)
      query(%q : tensor<16xf32>) save(o_pre_residual) -> tensor<8x64xf32>, tensor<8xf32>, tensor<8x32xi8>
  return
}

// -----

func.func @residual_odd_width(%a: tensor<8x63xbf16>, %q: tensor<16xf32>) {
  // expected-error @+1 {{the o_pre residual packs two elements a byte: the width D of o_pre 'tensor<8x63xbf16>' must be static and even}}
  %o, %lse, %r = attnres.forward sources(%a : tensor<8x63xbf16>)
      query(%q : tensor<16xf32>) save(o_pre_residual) -> tensor<8x63xbf16>, tensor<8xf32>, tensor<8x31xi8>
  return
}

// -----

func.func @residual_type(%a: tensor<8x64xbf16>, %q: tensor<3x16xf32>) {
  // expected-error @+1 {{the o_pre residual must have element type 'i8', got 'tensor<3x8x32xi16>'}}
  %o, %lse, %r = attnres.forward sources(%a : tensor<8x64xbf16>)
      query(%q : tensor<3x16xf32>) save(o_pre_residual) -> tensor<3x8x64xbf16>, tensor<3x8xf32>, tensor<3x8x32xi16>
  return
}

// -----

func.func @residual_shape(%a: tensor<8x64xbf16>, %q: tensor<3x16xf32>) {
  // expected-error @+1 {{the o_pre residual must be [M, T..., D/2] = [3, 8, 32], got 'tensor<8x32xi8>'}}
  %o, %lse, %r = attnres.forward sources(%a : tensor<8x64xbf16>)
      query(%q : tensor<3x16xf32>) save(o_pre_residual) -> tensor<3x8x64xbf16>, tensor<3x8xf32>, tensor<8x32xi8>
  return
}
