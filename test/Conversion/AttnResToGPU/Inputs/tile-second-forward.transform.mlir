// Tiles the second forward of the module by [1, 16] and leaves the first
// whole (keep-host-split-pieces.mlir).
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(
      %module: !transform.any_op {transform.readonly}) {
    %forwards = transform.structured.match ops{["attnres.forward"]}
        in %module : (!transform.any_op) -> !transform.any_op
    %first, %second = transform.split_handle %forwards
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    %tiled, %loops = transform.structured.tile_using_forall %second
        tile_sizes [1, 16]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.yield
  }
}
