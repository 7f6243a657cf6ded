// RUN: attnres-opt %s --split-input-file --verify-diagnostics
// Malformed attnres syntax gives a parse error at the offending token.

func.func @missing_sources(%q: tensor<16xf32>) {
  // expected-error @+1 {{expected 'sources' or 'packed'}}
  %o, %lse = attnres.forward query(%q : tensor<16xf32>) -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @missing_query(%v: tensor<8x64xf32>) {
  // expected-error @+1 {{expected 'query'}}
  %o, %lse = attnres.forward sources(%v : tensor<8x64xf32>) -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @missing_source_type(%v: tensor<8x64xf32>, %q: tensor<16xf32>) {
  // expected-error @+1 {{expected ':'}}
  %o, %lse = attnres.forward sources(%v) query(%q : tensor<16xf32>) -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @backward_missing_grad(%v: tensor<8x64xf32>, %q: tensor<16xf32>, %lse: tensor<8xf32>) {
  // expected-error @+1 {{expected 'grad'}}
  %dv, %dq = attnres.backward sources(%v : tensor<8x64xf32>) query(%q : tensor<16xf32>) lse(%lse : tensor<8xf32>) -> tensor<8x64xf32>, tensor<16xf32>
  return
}

// -----

func.func @undefined_source(%q: tensor<16xf32>) {
  // expected-error @+1 {{use of undeclared SSA value name}}
  %o, %lse = attnres.forward sources(%nope : tensor<8x64xf32>) query(%q : tensor<16xf32>) -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @wrong_result_count(%v: tensor<8x64xf32>, %q: tensor<16xf32>) {
  // expected-error @+1 {{operation defines 2 results but was provided 3 to bind}}
  %o, %lse, %x = attnres.forward sources(%v : tensor<8x64xf32>) query(%q : tensor<16xf32>) -> tensor<8x64xf32>, tensor<8xf32>
  return
}

// -----

func.func @partition_reduce_missing_kind(%p: tensor<4x16xf32>) {
  // expected-error @+1 {{expected string or keyword containing one of the following enum values for attribute 'kind' [softmax, sum]}}
  %o = attnres.partition_reduce %p : tensor<4x16xf32> -> tensor<16xf32>
  return
}
