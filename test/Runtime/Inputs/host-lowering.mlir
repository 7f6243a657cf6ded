// Host code and kernels in upstream MLIR only (no attnres op): what
// host-lowering*.test lower with Debian's mlir-opt-22 and link against
// libAttnResRuntime, whose mgpu* functions the lowered host code calls.
module attributes {gpu.container_module} {
  gpu.module @kernels {
    // y[i] = x[i] + y[i] + c[i]
    gpu.func @add3(%x: memref<?xf32>, %y: memref<?xf32>, %c: memref<?xf32>,
                   %n: index) kernel {
      %i = gpu.global_id x
      %inside = arith.cmpi ult, %i, %n : index
      scf.if %inside {
        %a = memref.load %x[%i] : memref<?xf32>
        %b = memref.load %y[%i] : memref<?xf32>
        %d = memref.load %c[%i] : memref<?xf32>
        %s = arith.addf %a, %b : f32
        %t = arith.addf %s, %d : f32
        memref.store %t, %y[%i] : memref<?xf32>
      }
      gpu.return
    }
  }

  // y += x + fill, on the device: allocations, copies both ways, a fill
  // (mgpuMemset32) and a launch of ceil(n / 128) blocks.
  func.func @add_fill(%x: memref<?xf32>, %y: memref<?xf32>, %n: index,
                      %fill: f32) {
    %c1 = arith.constant 1 : index
    %c128 = arith.constant 128 : index
    %blocks = arith.ceildivui %n, %c128 : index
    %dx = gpu.alloc (%n) : memref<?xf32>
    %dy = gpu.alloc (%n) : memref<?xf32>
    %dc = gpu.alloc (%n) : memref<?xf32>
    gpu.memcpy %dx, %x : memref<?xf32>, memref<?xf32>
    gpu.memcpy %dy, %y : memref<?xf32>, memref<?xf32>
    gpu.memset %dc, %fill : memref<?xf32>, f32
    gpu.launch_func @kernels::@add3 blocks in (%blocks, %c1, %c1)
        threads in (%c128, %c1, %c1)
        args(%dx : memref<?xf32>, %dy : memref<?xf32>, %dc : memref<?xf32>,
             %n : index)
    gpu.memcpy %y, %dy : memref<?xf32>, memref<?xf32>
    gpu.dealloc %dx : memref<?xf32>
    gpu.dealloc %dy : memref<?xf32>
    gpu.dealloc %dc : memref<?xf32>
    return
  }

  // The same launch in clusters of two blocks (mgpuLaunchClusterKernel;
  // sm_90 and later), on buffers already on the device.
  func.func @add_clustered(%dx: memref<?xf32>, %dy: memref<?xf32>,
                           %dc: memref<?xf32>, %n: index) {
    %c1 = arith.constant 1 : index
    %c2 = arith.constant 2 : index
    %c256 = arith.constant 256 : index
    %c128 = arith.constant 128 : index
    %pairs = arith.ceildivui %n, %c256 : index
    %blocks = arith.muli %pairs, %c2 : index
    gpu.launch_func @kernels::@add3 clusters in (%c2, %c1, %c1)
        blocks in (%blocks, %c1, %c1) threads in (%c128, %c1, %c1)
        args(%dx : memref<?xf32>, %dy : memref<?xf32>, %dc : memref<?xf32>,
             %n : index)
    return
  }
}
