// RUN: attnres-opt %s --split-input-file --verify-diagnostics
// Verifier rules of attnres.backward: its operands must be those of a forward
// (the shared rules are in invalid.mlir) and its results their gradients.

func.func @grad_shape(%v: tensor<?x64xbf16>, %q: tensor<16xf32>, %do: tensor<?x32xbf16>, %lse: tensor<?xf32>) {
  // expected-error @+1 {{grad (the gradient of the output) must be [T..., D] = [?, 64], got 'tensor<?x32xbf16>'}}
  %dv, %dq = attnres.backward sources(%v : tensor<?x64xbf16>) query(%q : tensor<16xf32>)
      grad(%do : tensor<?x32xbf16>) lse(%lse : tensor<?xf32>)
      -> tensor<?x64xbf16>, tensor<16xf32>
  return
}

// -----

func.func @grad_missing_query_dim(%v: tensor<?x64xbf16>, %q: tensor<2x16xf32>, %do: tensor<?x64xbf16>, %lse: tensor<2x?xf32>) {
  // expected-error @+1 {{grad (the gradient of the output) must be [M, T..., D] = [2, ?, 64], got 'tensor<?x64xbf16>'}}
  %dv, %dq = attnres.backward sources(%v : tensor<?x64xbf16>) query(%q : tensor<2x16xf32>)
      grad(%do : tensor<?x64xbf16>) lse(%lse : tensor<2x?xf32>)
      -> tensor<?x64xbf16>, tensor<2x16xf32>
  return
}

// -----

func.func @grad_element_type(%v: tensor<?x64xbf16>, %q: tensor<16xf32>, %do: tensor<?x64xf64>, %lse: tensor<?xf32>) {
  // expected-error @+1 {{grad (the gradient of the output) has element type 'f64'; it must be bf16, f16 or f32}}
  %dv, %dq = attnres.backward sources(%v : tensor<?x64xbf16>) query(%q : tensor<16xf32>)
      grad(%do : tensor<?x64xf64>) lse(%lse : tensor<?xf32>)
      -> tensor<?x64xbf16>, tensor<16xf32>
  return
}

// -----

func.func @lse_shape(%v: tensor<8x64xbf16>, %q: tensor<16xf32>, %do: tensor<8x64xbf16>, %lse: tensor<4xf32>) {
  // expected-error @+1 {{lse (the forward's log-sum-exp) must be [T...] = [8], got 'tensor<4xf32>'}}
  %dv, %dq = attnres.backward sources(%v : tensor<8x64xbf16>) query(%q : tensor<16xf32>)
      grad(%do : tensor<8x64xbf16>) lse(%lse : tensor<4xf32>)
      -> tensor<8x64xbf16>, tensor<16xf32>
  return
}

// -----

func.func @lse_type(%v: tensor<8x64xbf16>, %q: tensor<16xf32>, %do: tensor<8x64xbf16>, %lse: tensor<8xbf16>) {
  // expected-error @+1 {{lse (the forward's log-sum-exp) must have element type 'f32', got 'tensor<8xbf16>'}}
  %dv, %dq = attnres.backward sources(%v : tensor<8x64xbf16>) query(%q : tensor<16xf32>)
      grad(%do : tensor<8x64xbf16>) lse(%lse : tensor<8xbf16>)
      -> tensor<8x64xbf16>, tensor<16xf32>
  return
}

// -----

func.func @saved_shape(%v: tensor<8x64xbf16>, %q: tensor<16xf32>, %do: tensor<8x64xbf16>, %lse: tensor<8xf32>, %o: tensor<8x16xbf16>) {
  // expected-error @+1 {{saved (the forward's o_pre) must be [T..., D] = [8, 64], got 'tensor<8x16xbf16>'}}
  %dv, %dq = attnres.backward sources(%v : tensor<8x64xbf16>) query(%q : tensor<16xf32>)
      grad(%do : tensor<8x64xbf16>) lse(%lse : tensor<8xf32>) saved(%o : tensor<8x16xbf16>)
      -> tensor<8x64xbf16>, tensor<16xf32>
  return
}

// -----

func.func @saved_element_type(%v: tensor<8x64xbf16>, %q: tensor<16xf32>, %do: tensor<8x64xbf16>, %lse: tensor<8xf32>, %o: tensor<8x64xi16>) {
  // expected-error @+1 {{saved (the forward's o_pre) has element type 'i16'; it must be bf16, f16 or f32}}
  %dv, %dq = attnres.backward sources(%v : tensor<8x64xbf16>) query(%q : tensor<16xf32>)
      grad(%do : tensor<8x64xbf16>) lse(%lse : tensor<8xf32>) saved(%o : tensor<8x64xi16>)
      -> tensor<8x64xbf16>, tensor<16xf32>
  return
}

// -----

func.func @shared_rule_rank(%v: tensor<8x64xbf16>, %q: tensor<80xf32>, %do: tensor<8x64xbf16>, %lse: tensor<8xf32>) {
  // expected-error @+1 {{query rank R = 80 exceeds the source width D = 64}}
  %dv, %dq = attnres.backward sources(%v : tensor<8x64xbf16>) query(%q : tensor<80xf32>)
      grad(%do : tensor<8x64xbf16>) lse(%lse : tensor<8xf32>)
      -> tensor<8x64xbf16>, tensor<80xf32>
  return
}

// -----

func.func @shared_rule_eps(%v: tensor<8x64xbf16>, %q: tensor<16xf32>, %do: tensor<8x64xbf16>, %lse: tensor<8xf32>) {
  // expected-error @+1 {{eps must be finite and > 0, got 0}}
  %dv, %dq = attnres.backward sources(%v : tensor<8x64xbf16>) query(%q : tensor<16xf32>)
      grad(%do : tensor<8x64xbf16>) lse(%lse : tensor<8xf32>) {eps = 0.0 : f64}
      -> tensor<8x64xbf16>, tensor<16xf32>
  return
}

// -----

func.func @result_type_count(%v: tensor<8x64xbf16>, %q: tensor<16xf32>, %g: tensor<16xf32>, %do: tensor<8x64xbf16>, %lse: tensor<8xf32>) {
  // expected-error @+3 {{expected 4 result types (one per source gradient, the query gradient, then one per weight gradient), got 3}}
  %dv:2, %dq, %dg = attnres.backward sources(%v, %v : tensor<8x64xbf16>) query(%q : tensor<16xf32>)
      key_norm(%g : tensor<16xf32>) grad(%do : tensor<8x64xbf16>) lse(%lse : tensor<8xf32>)
      -> tensor<8x64xbf16>, tensor<16xf32>, tensor<16xf32>
  return
}

// -----

func.func @gradient_count(%v: tensor<8x64xbf16>, %q: tensor<16xf32>, %do: tensor<8x64xbf16>, %lse: tensor<8xf32>) {
  // expected-error @+1 {{expects one source gradient per source operand (2), got 1}}
  %r:2 = "attnres.backward"(%v, %v, %q, %do, %lse) <{operandSegmentSizes = array<i32: 2, 1, 0, 0, 1, 1, 0, 0, 0, 0>, resultSegmentSizes = array<i32: 1, 1, 0, 0>}>
      : (tensor<8x64xbf16>, tensor<8x64xbf16>, tensor<16xf32>, tensor<8x64xbf16>, tensor<8xf32>) -> (tensor<8x64xbf16>, tensor<16xf32>)
  return
}

// -----

func.func @gradient_type(%v: tensor<8x64xbf16>, %q: tensor<16xf32>, %do: tensor<8x64xbf16>, %lse: tensor<8xf32>) {
  // expected-error @+1 {{source gradient #0 must have the type of source #0 'tensor<8x64xbf16>', got 'tensor<8x64xf32>'}}
  %r:2 = "attnres.backward"(%v, %q, %do, %lse) <{operandSegmentSizes = array<i32: 1, 1, 0, 0, 1, 1, 0, 0, 0, 0>, resultSegmentSizes = array<i32: 1, 1, 0, 0>}>
      : (tensor<8x64xbf16>, tensor<16xf32>, tensor<8x64xbf16>, tensor<8xf32>) -> (tensor<8x64xf32>, tensor<16xf32>)
  return
}

// -----

func.func @query_gradient_type(%v: tensor<8x64xbf16>, %q: tensor<16xf32>, %do: tensor<8x64xbf16>, %lse: tensor<8xf32>) {
  // expected-error @+1 {{query gradient must have the type of the query 'tensor<16xf32>' or its shape in f32 (an FP32 partial), got 'tensor<16xbf16>'}}
  %r:2 = "attnres.backward"(%v, %q, %do, %lse) <{operandSegmentSizes = array<i32: 1, 1, 0, 0, 1, 1, 0, 0, 0, 0>, resultSegmentSizes = array<i32: 1, 1, 0, 0>}>
      : (tensor<8x64xbf16>, tensor<16xf32>, tensor<8x64xbf16>, tensor<8xf32>) -> (tensor<8x64xbf16>, tensor<16xbf16>)
  return
}

// -----

func.func @key_norm_gradient_without_weight(%v: tensor<8x64xbf16>, %q: tensor<16xf32>, %do: tensor<8x64xbf16>, %lse: tensor<8xf32>) {
  // expected-error @+1 {{has a key_norm weight gradient but no key_norm weight}}
  %r:3 = "attnres.backward"(%v, %q, %do, %lse) <{operandSegmentSizes = array<i32: 1, 1, 0, 0, 1, 1, 0, 0, 0, 0>, resultSegmentSizes = array<i32: 1, 1, 1, 0>}>
      : (tensor<8x64xbf16>, tensor<16xf32>, tensor<8x64xbf16>, tensor<8xf32>) -> (tensor<8x64xbf16>, tensor<16xf32>, tensor<16xf32>)
  return
}

// -----

func.func @output_norm_gradient_missing(%v: tensor<8x64xbf16>, %q: tensor<16xf32>, %h: tensor<64xf32>, %do: tensor<8x64xbf16>, %lse: tensor<8xf32>) {
  // expected-error @+1 {{has a output_norm weight but no output_norm weight gradient result}}
  %r:2 = "attnres.backward"(%v, %q, %h, %do, %lse) <{operandSegmentSizes = array<i32: 1, 1, 0, 1, 1, 1, 0, 0, 0, 0>, resultSegmentSizes = array<i32: 1, 1, 0, 0>}>
      : (tensor<8x64xbf16>, tensor<16xf32>, tensor<64xf32>, tensor<8x64xbf16>, tensor<8xf32>) -> (tensor<8x64xbf16>, tensor<16xf32>)
  return
}

// -----

func.func @output_norm_gradient_type(%v: tensor<8x64xbf16>, %q: tensor<16xf32>, %h: tensor<64xf32>, %do: tensor<8x64xbf16>, %lse: tensor<8xf32>) {
  // expected-error @+1 {{output_norm weight gradient must have the type of the output_norm weight 'tensor<64xf32>' or its shape in f32 (an FP32 partial), got 'tensor<64xbf16>'}}
  %r:3 = "attnres.backward"(%v, %q, %h, %do, %lse) <{operandSegmentSizes = array<i32: 1, 1, 0, 1, 1, 1, 0, 0, 0, 0>, resultSegmentSizes = array<i32: 1, 1, 0, 1>}>
      : (tensor<8x64xbf16>, tensor<16xf32>, tensor<64xf32>, tensor<8x64xbf16>, tensor<8xf32>) -> (tensor<8x64xbf16>, tensor<16xf32>, tensor<64xbf16>)
  return
}

// -----

func.func @partial_gradient_shape(%v: tensor<8x64xbf16>, %q: tensor<16xbf16>, %do: tensor<8x64xbf16>, %lse: tensor<8xf32>) {
  // expected-error @+1 {{query gradient must have the type of the query 'tensor<16xbf16>' or its shape in f32 (an FP32 partial), got 'tensor<8x16xf32>'}}
  %r:2 = "attnres.backward"(%v, %q, %do, %lse) <{operandSegmentSizes = array<i32: 1, 1, 0, 0, 1, 1, 0, 0, 0, 0>, resultSegmentSizes = array<i32: 1, 1, 0, 0>}>
      : (tensor<8x64xbf16>, tensor<16xbf16>, tensor<8x64xbf16>, tensor<8xf32>) -> (tensor<8x64xbf16>, tensor<8x16xf32>)
  return
}

// -----

// A weight whose size the sources fix may not be dynamic: this verified once
// and then failed in attnres-split-reduction ("'tensor.empty' op incorrect
// number of dynamic sizes").
func.func @dynamic_output_norm(%v0: tensor<?x64xbf16>, %q: tensor<16xf32>, %h: tensor<?xbf16>, %do: tensor<?x64xbf16>, %lse: tensor<?xf32>, %o_pre: tensor<?x64xbf16>) {
  // expected-error @+1 {{output_norm weight must be [D] = [64], got 'tensor<?xbf16>': dimension 0 must be static (the op's other operands fix it to 64)}}
  %dv, %dq, %dh = attnres.backward sources(%v0 : tensor<?x64xbf16>)
      query(%q : tensor<16xf32>) output_norm(%h : tensor<?xbf16>) grad(%do : tensor<?x64xbf16>)
      lse(%lse : tensor<?xf32>) saved(%o_pre : tensor<?x64xbf16>)
      -> tensor<?x64xbf16>, tensor<16xf32>, tensor<?xbf16>
  return
}

// -----

func.func @residual_without_saved(%a: tensor<8x64xbf16>, %q: tensor<16xf32>, %do: tensor<8x64xbf16>, %lse: tensor<8xf32>, %r: tensor<8x32xi8>) {
  // expected-error @+1 {{residual(...) is the residual of the saved o_pre: it needs saved(...)}}
  %dv, %dq = attnres.backward sources(%a : tensor<8x64xbf16>) query(%q : tensor<16xf32>)
      grad(%do : tensor<8x64xbf16>) lse(%lse : tensor<8xf32>) residual(%r : tensor<8x32xi8>)
      -> tensor<8x64xbf16>, tensor<16xf32>
  return
}

// -----

func.func @residual_of_f32_saved(%a: tensor<8x64xf32>, %q: tensor<16xf32>, %do: tensor<8x64xf32>, %lse: tensor<8xf32>, %o: tensor<8x64xf32>, %r: tensor<8x32xi8>) {
  // expected-error @+1 {{residual (of the saved o_pre) is the residual of a 16-bit o_pre (bf16 or f16), but o_pre is 'tensor<8x64xf32>'}}
  %dv, %dq = attnres.backward sources(%a : tensor<8x64xf32>) query(%q : tensor<16xf32>)
      grad(%do : tensor<8x64xf32>) lse(%lse : tensor<8xf32>) saved(%o : tensor<8x64xf32>)
      residual(%r : tensor<8x32xi8>) -> tensor<8x64xf32>, tensor<16xf32>
  return
}

// -----

func.func @residual_shape(%a: tensor<?x64xbf16>, %q: tensor<16xf32>, %do: tensor<?x64xbf16>, %lse: tensor<?xf32>, %o: tensor<?x64xbf16>, %r: tensor<?x64xi8>) {
  // expected-error @+1 {{residual (of the saved o_pre) must be [T..., D/2] = [?, 32], got 'tensor<?x64xi8>'}}
  %dv, %dq = attnres.backward sources(%a : tensor<?x64xbf16>) query(%q : tensor<16xf32>)
      grad(%do : tensor<?x64xbf16>) lse(%lse : tensor<?xf32>) saved(%o : tensor<?x64xbf16>)
      residual(%r : tensor<?x64xi8>) -> tensor<?x64xbf16>, tensor<16xf32>
  return
}

// -----

func.func @grad_lse_shape(%a: tensor<?x64xbf16>, %q: tensor<2x16xf32>, %do: tensor<2x?x64xbf16>, %lse: tensor<2x?xf32>, %dlse: tensor<?xf32>) {
  // expected-error @+1 {{grad_lse (the gradient of the forward's lse) must be [M, T...] = [2, ?], got 'tensor<?xf32>'}}
  %dv, %dq = attnres.backward sources(%a : tensor<?x64xbf16>) query(%q : tensor<2x16xf32>)
      grad(%do : tensor<2x?x64xbf16>) lse(%lse : tensor<2x?xf32>) grad_lse(%dlse : tensor<?xf32>)
      -> tensor<?x64xbf16>, tensor<2x16xf32>
  return
}

// -----

func.func @grad_lse_type(%a: tensor<?x64xbf16>, %q: tensor<16xf32>, %do: tensor<?x64xbf16>, %lse: tensor<?xf32>, %dlse: tensor<?xbf16>) {
  // expected-error @+1 {{grad_lse (the gradient of the forward's lse) must have element type 'f32', got 'tensor<?xbf16>'}}
  %dv, %dq = attnres.backward sources(%a : tensor<?x64xbf16>) query(%q : tensor<16xf32>)
      grad(%do : tensor<?x64xbf16>) lse(%lse : tensor<?xf32>) grad_lse(%dlse : tensor<?xbf16>)
      -> tensor<?x64xbf16>, tensor<16xf32>
  return
}

// -----

func.func @accumulate_count(%a: tensor<?x64xbf16>, %b: tensor<?x64xbf16>, %q: tensor<16xf32>, %do: tensor<?x64xbf16>, %lse: tensor<?xf32>, %g: tensor<?x64xbf16>) {
  // expected-error @+1 {{accumulate(...) takes one gradient per source operand (2), got 1}}
  %dv:2, %dq = attnres.backward sources(%a, %b : tensor<?x64xbf16>) query(%q : tensor<16xf32>)
      grad(%do : tensor<?x64xbf16>) lse(%lse : tensor<?xf32>) accumulate(%g : tensor<?x64xbf16>)
      -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xf32>
  return
}

// -----

func.func @accumulate_type(%a: tensor<?x64xbf16>, %q: tensor<16xf32>, %do: tensor<?x64xbf16>, %lse: tensor<?xf32>, %g: tensor<?x64xf32>) {
  // expected-error @+1 {{accumulated gradient #0 must have the type of source gradient #0 'tensor<?x64xbf16>', got 'tensor<?x64xf32>'}}
  %dv, %dq = attnres.backward sources(%a : tensor<?x64xbf16>) query(%q : tensor<16xf32>)
      grad(%do : tensor<?x64xbf16>) lse(%lse : tensor<?xf32>) accumulate(%g : tensor<?x64xf32>)
      -> tensor<?x64xbf16>, tensor<16xf32>
  return
}

// -----

func.func @accumulate_packed_shape(%v: tensor<3x?x64xbf16>, %q: tensor<16xf32>, %do: tensor<?x64xbf16>, %lse: tensor<?xf32>, %g: tensor<2x?x64xbf16>) {
  // expected-error @+1 {{accumulated gradient #0 must have the type of source gradient #0 'tensor<3x?x64xbf16>', got 'tensor<2x?x64xbf16>'}}
  %dv, %dq = attnres.backward packed(%v : tensor<3x?x64xbf16>) query(%q : tensor<16xf32>)
      grad(%do : tensor<?x64xbf16>) lse(%lse : tensor<?xf32>) accumulate(%g : tensor<2x?x64xbf16>)
      -> tensor<3x?x64xbf16>, tensor<16xf32>
  return
}
