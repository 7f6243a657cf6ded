// RUN: not attnres-opt %s --attnres-lower-to-llvm-cpu-pipeline 2>&1 | FileCheck %s
// Invalid attnres IR stops with the verifier's diagnostic before any
// lowering runs; nothing crashes.

// CHECK: error: 'attnres.forward' op query rank R = 128 exceeds the source width D = 64
// CHECK-NOT: Stack dump
func.func @bad(%v: tensor<?x64xf32>, %q: tensor<128xf32>) -> tensor<?x64xf32> {
  %o, %lse = attnres.forward sources(%v : tensor<?x64xf32>) query(%q : tensor<128xf32>)
      -> tensor<?x64xf32>, tensor<?xf32>
  return %o : tensor<?x64xf32>
}
