// RUN: attnres-opt %s --split-input-file --verify-diagnostics
// Verifier rules of attnres.partition_reduce.

func.func @softmax_rank(%p: tensor<4xf32>, %l: tensor<4xf32>) {
  // expected-error @+1 {{partials must be [P, T..., D] (rank >= 2) for the softmax kind, got 'tensor<4xf32>'}}
  %o, %lse = attnres.partition_reduce softmax %p : tensor<4xf32> lse(%l : tensor<4xf32>)
      -> tensor<f32>, tensor<f32>
  return
}

// -----

func.func @sum_rank(%p: tensor<f32>) {
  // expected-error @+1 {{partials must be [P, S...] (rank >= 1) for the sum kind, got 'tensor<f32>'}}
  %o = attnres.partition_reduce sum %p : tensor<f32> -> tensor<f32>
  return
}

// -----

func.func @dynamic_partition_count(%p: tensor<?x16xf32>) {
  // expected-error @+1 {{partition count P (leading dimension of partials) must be static, got 'tensor<?x16xf32>'}}
  %o = attnres.partition_reduce sum %p : tensor<?x16xf32> -> tensor<16xf32>
  return
}

// -----

func.func @zero_partitions(%p: tensor<0x16xf32>) {
  // expected-error @+1 {{requires at least one partition (P >= 1), got 'tensor<0x16xf32>'}}
  %o = attnres.partition_reduce sum %p : tensor<0x16xf32> -> tensor<16xf32>
  return
}

// -----

func.func @partials_not_f32(%p: tensor<4x?x64xbf16>, %l: tensor<4x?xf32>) {
  // expected-error @+1 {{partials must be f32 (partials are FP32), got 'tensor<4x?x64xbf16>'}}
  %o, %lse = attnres.partition_reduce softmax %p : tensor<4x?x64xbf16> lse(%l : tensor<4x?xf32>)
      -> tensor<?x64xbf16>, tensor<?xf32>
  return
}

// -----

func.func @softmax_without_lse(%p: tensor<4x?x64xf32>) {
  // expected-error @+1 {{the softmax kind requires the partitions' lse(...) operand}}
  %o, %lse = attnres.partition_reduce softmax %p : tensor<4x?x64xf32>
      -> tensor<?x64xf32>, tensor<?xf32>
  return
}

// -----

func.func @mismatched_partition_count(%p: tensor<4x?x64xf32>, %l: tensor<3x?xf32>) {
  // expected-error @+1 {{lse has 3 partitions but partials have 4}}
  %o, %lse = attnres.partition_reduce softmax %p : tensor<4x?x64xf32> lse(%l : tensor<3x?xf32>)
      -> tensor<?x64xf32>, tensor<?xf32>
  return
}

// -----

func.func @lse_shape(%p: tensor<4x8x64xf32>, %l: tensor<4x9xf32>) {
  // expected-error @+1 {{lse must be [P, T...] = [4, 8], got 'tensor<4x9xf32>'}}
  %o, %lse = attnres.partition_reduce softmax %p : tensor<4x8x64xf32> lse(%l : tensor<4x9xf32>)
      -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @lse_type(%p: tensor<4x8x64xf32>, %l: tensor<4x8xf16>) {
  // expected-error @+1 {{lse must have element type 'f32', got 'tensor<4x8xf16>'}}
  %o, %lse = attnres.partition_reduce softmax %p : tensor<4x8x64xf32> lse(%l : tensor<4x8xf16>)
      -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @sink_shape(%p: tensor<4x8x64xf32>, %l: tensor<4x8xf32>, %s: tensor<4x8xf32>) {
  // expected-error @+1 {{sink must be [T...] = [8], got 'tensor<4x8xf32>'}}
  %o, %lse = attnres.partition_reduce softmax %p : tensor<4x8x64xf32> lse(%l : tensor<4x8xf32>)
      sink(%s : tensor<4x8xf32>) -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @softmax_one_result(%p: tensor<4x8x64xf32>, %l: tensor<4x8xf32>) {
  // expected-error @+1 {{the softmax kind has two results, the merged output and the merged lse}}
  %o = attnres.partition_reduce softmax %p : tensor<4x8x64xf32> lse(%l : tensor<4x8xf32>)
      -> tensor<8x64xf32>
  return
}

// -----

func.func @softmax_output_shape(%p: tensor<4x8x64xf32>, %l: tensor<4x8xf32>) {
  // expected-error @+1 {{output must be [T..., D] = [8, 64], got 'tensor<4x8x64xf32>'}}
  %o, %lse = attnres.partition_reduce softmax %p : tensor<4x8x64xf32> lse(%l : tensor<4x8xf32>)
      -> tensor<4x8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @softmax_output_type(%p: tensor<4x8x64xf32>, %l: tensor<4x8xf32>) {
  // expected-error @+1 {{output has element type 'f64'; it must be bf16, f16 or f32}}
  %o, %lse = attnres.partition_reduce softmax %p : tensor<4x8x64xf32> lse(%l : tensor<4x8xf32>)
      -> tensor<8x64xf64>, tensor<8xf32>
  return
}

// -----

func.func @merged_lse_type(%p: tensor<4x8x64xf32>, %l: tensor<4x8xf32>) {
  // expected-error @+1 {{merged lse must have element type 'f32', got 'tensor<8xbf16>'}}
  %o, %lse = attnres.partition_reduce softmax %p : tensor<4x8x64xf32> lse(%l : tensor<4x8xf32>)
      -> tensor<8x64xf32>, tensor<8xbf16>
  return
}

// -----

func.func @sum_with_lse(%p: tensor<4x16xf32>, %l: tensor<4xf32>) {
  // expected-error @+1 {{the sum kind takes no lse(...) operand}}
  %o = attnres.partition_reduce sum %p : tensor<4x16xf32> lse(%l : tensor<4xf32>) -> tensor<16xf32>
  return
}

// -----

func.func @sum_with_sink(%p: tensor<4x16xf32>, %s: tensor<f32>) {
  // expected-error @+1 {{the sum kind takes no sink(...) operand}}
  %o = attnres.partition_reduce sum %p : tensor<4x16xf32> sink(%s : tensor<f32>) -> tensor<16xf32>
  return
}

// -----

func.func @sum_two_results(%p: tensor<4x16xf32>) {
  // expected-error @+1 {{the sum kind has one result, the sum}}
  %o, %l = attnres.partition_reduce sum %p : tensor<4x16xf32> -> tensor<16xf32>, tensor<f32>
  return
}

// -----

func.func @sum_output_shape(%p: tensor<4x16xf32>) {
  // expected-error @+1 {{output must be [S...] = [16], got 'tensor<4x16xf32>'}}
  %o = attnres.partition_reduce sum %p : tensor<4x16xf32> -> tensor<4x16xf32>
  return
}

// -----

func.func @unknown_kind(%p: tensor<4x16xf32>) {
  // expected-error @+1 {{expected string or keyword containing one of the following enum values for attribute 'kind' [softmax, sum]}}
  %o = attnres.partition_reduce max %p : tensor<4x16xf32> -> tensor<16xf32>
  return
}

// -----

func.func @sum_with_output_norm(%p: tensor<4x16xf32>, %h: tensor<16xf32>) {
  // expected-error @+1 {{the sum kind takes no output_norm(...) operand}}
  %o = attnres.partition_reduce sum %p : tensor<4x16xf32> output_norm(%h : tensor<16xf32>) -> tensor<16xf32>
  return
}

// -----

func.func @o_pre_without_output_norm(%p: tensor<4x8x64xf32>, %l: tensor<4x8xf32>) {
  // expected-error @+1 {{o_pre is a result only with an output_norm(...) operand (without one the output is o_pre)}}
  %o, %lse, %o_pre = attnres.partition_reduce softmax %p : tensor<4x8x64xf32> lse(%l : tensor<4x8xf32>)
      -> tensor<8x64xf32>, tensor<8xf32>, tensor<8x64xf32>
  return
}

// -----

func.func @output_norm_width(%p: tensor<4x8x64xf32>, %l: tensor<4x8xf32>, %h: tensor<32xf32>) {
  // expected-error @+1 {{output_norm weight must be [D] = [64], got 'tensor<32xf32>'}}
  %o, %lse = attnres.partition_reduce softmax %p : tensor<4x8x64xf32> lse(%l : tensor<4x8xf32>)
      output_norm(%h : tensor<32xf32>) -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @output_norm_leading(%p: tensor<4x3x8x64xf32>, %l: tensor<4x3x8xf32>, %h: tensor<2x64xf32>) {
  // expected-error @+1 {{output_norm weight must be [K, D] (K the leading result dimension) = [3, 64], got 'tensor<2x64xf32>'}}
  %o, %lse = attnres.partition_reduce softmax %p : tensor<4x3x8x64xf32> lse(%l : tensor<4x3x8xf32>)
      output_norm(%h : tensor<2x64xf32>) -> tensor<3x8x64xf32>, tensor<3x8xf32>
  return
}

// -----

func.func @output_norm_rank1_result(%p: tensor<4x64xf32>, %l: tensor<4xf32>, %h: tensor<1x64xf32>) {
  // expected-error @+1 {{output_norm weight must be [D] = [64] for a result of rank 1, got 'tensor<1x64xf32>'}}
  %o, %lse = attnres.partition_reduce softmax %p : tensor<4x64xf32> lse(%l : tensor<4xf32>)
      output_norm(%h : tensor<1x64xf32>) -> tensor<64xf32>, tensor<f32>
  return
}

// -----

func.func @output_norm_eps(%p: tensor<4x8x64xf32>, %l: tensor<4x8xf32>, %h: tensor<64xf32>) {
  // expected-error @+1 {{eps must be finite and > 0, got 0}}
  %o, %lse = attnres.partition_reduce softmax %p : tensor<4x8x64xf32> lse(%l : tensor<4x8xf32>)
      output_norm(%h : tensor<64xf32>) {eps = 0.0 : f64} -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @o_pre_type(%p: tensor<4x8x64xf32>, %l: tensor<4x8xf32>, %h: tensor<64xf32>) {
  // expected-error @+1 {{o_pre must have the type of the output 'tensor<8x64xbf16>', got 'tensor<8x64xf32>'}}
  %o, %lse, %o_pre = attnres.partition_reduce softmax %p : tensor<4x8x64xf32> lse(%l : tensor<4x8xf32>)
      output_norm(%h : tensor<64xf32>) -> tensor<8x64xbf16>, tensor<8xf32>, tensor<8x64xf32>
  return
}

// -----

func.func @too_many_result_types(%p: tensor<4x16xf32>) {
  // expected-error @+1 {{expected 1 to 4 result types (output, lse, o_pre, o_pre residual), got 5}}
  %o = attnres.partition_reduce sum %p : tensor<4x16xf32> -> tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>
  return
}

// -----

func.func @two_o_pre_types(%p: tensor<4x8x64xf32>, %l: tensor<4x8xf32>) {
  // expected-error @+1 {{after the output and the lse, expected o_pre (a float tensor) and then its residual (an i8 tensor), got 4 types}}
  %o, %lse, %a, %b = attnres.partition_reduce softmax %p : tensor<4x8x64xf32> lse(%l : tensor<4x8xf32>) -> tensor<8x64xbf16>, tensor<8xf32>, tensor<8x64xbf16>, tensor<8x64xbf16>
  return
}

// -----

func.func @residual_before_o_pre(%p: tensor<4x8x64xf32>, %l: tensor<4x8xf32>, %h: tensor<64xf32>) {
  // expected-error @+1 {{after the output and the lse, expected o_pre (a float tensor) and then its residual (an i8 tensor), got 4 types}}
  %o, %lse, %r, %o_pre = attnres.partition_reduce softmax %p : tensor<4x8x64xf32> lse(%l : tensor<4x8xf32>) output_norm(%h : tensor<64xf32>) -> tensor<8x64xbf16>, tensor<8xf32>, tensor<8x32xi8>, tensor<8x64xbf16>
  return
}

// -----

func.func @sum_with_residual(%p: tensor<4x8x64xf32>) {
  // expected-error @+1 {{the sum kind has one result, the sum}}
  %o, %r = "attnres.partition_reduce"(%p) <{kind = 1 : i32, operandSegmentSizes = array<i32: 1, 0, 0, 0>, resultSegmentSizes = array<i32: 1, 0, 0, 1>}> : (tensor<4x8x64xf32>) -> (tensor<8x64xbf16>, tensor<8x32xi8>)
  return
}

// -----

func.func @residual_of_f32(%p: tensor<4x8x64xf32>, %l: tensor<4x8xf32>) {
  // expected-error @+1 {{the o_pre residual is the residual of a 16-bit o_pre (bf16 or f16), but o_pre is 'tensor<8x64xf32>'}}
  %o, %lse, %r = attnres.partition_reduce softmax %p : tensor<4x8x64xf32> lse(%l : tensor<4x8xf32>) -> tensor<8x64xf32>, tensor<8xf32>, tensor<8x32xi8>
  return
}

// -----

func.func @residual_width(%p: tensor<4x8x64xf32>, %l: tensor<4x8xf32>) {
  // expected-error @+1 {{the o_pre residual must be [T..., D/2] = [8, 32], got 'tensor<8x64xi8>'}}
  %o, %lse, %r = attnres.partition_reduce softmax %p : tensor<4x8x64xf32> lse(%l : tensor<4x8xf32>) -> tensor<8x64xbf16>, tensor<8xf32>, tensor<8x64xi8>
  return
}

// -----

func.func @residual_without_its_o_pre(%p: tensor<4x8x64xf32>, %l: tensor<4x8xf32>, %h: tensor<64xf32>) {
  // expected-error @+1 {{with an output norm, the o_pre residual needs the o_pre result it belongs to}}
  %o, %lse, %r = attnres.partition_reduce softmax %p : tensor<4x8x64xf32> lse(%l : tensor<4x8xf32>) output_norm(%h : tensor<64xf32>) -> tensor<8x64xbf16>, tensor<8xf32>, tensor<8x32xi8>
  return
}

// -----

// A result dimension the partials fix may not be dynamic: this verified once
// and then divided by zero in convert-attnres-to-gpu.
func.func @softmax_dynamic_result_width(%o: tensor<4x?x64xf32>, %lse: tensor<4x?xf32>) -> tensor<4x?xf32> {
  // expected-error @+1 {{output must be [T..., D] = [?, 64], got 'tensor<4x?xf32>': dimension 1 must be static (the op's other operands fix it to 64)}}
  %b, %lb = attnres.partition_reduce softmax %o : tensor<4x?x64xf32>
      lse(%lse : tensor<4x?xf32>) -> tensor<4x?xf32>, tensor<?xf32>
  return %b : tensor<4x?xf32>
}

// -----

func.func @softmax_dynamic_width(%o: tensor<4x?x?xf32>, %lse: tensor<4x?xf32>) {
  // expected-error @+1 {{the row width D (last dimension of partials) must be static for the softmax kind, got 'tensor<4x?x?xf32>'}}
  %b, %lb = attnres.partition_reduce softmax %o : tensor<4x?x?xf32>
      lse(%lse : tensor<4x?xf32>) -> tensor<?x?xf32>, tensor<?xf32>
  return
}

// -----

func.func @too_many_partitions(%p: tensor<4097x?x64xf32>, %l: tensor<4097x?xf32>) {
  // expected-error @+1 {{partition count P = 4097 is out of range [1, 4096]}}
  %o, %lse = attnres.partition_reduce softmax %p : tensor<4097x?x64xf32> lse(%l : tensor<4097x?xf32>)
      -> tensor<?x64xf32>, tensor<?xf32>
  return
}
