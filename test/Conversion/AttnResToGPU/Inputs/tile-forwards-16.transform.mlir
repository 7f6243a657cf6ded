// Tiles every forward by 16 over its first token dimension
// (keep-host-tile.mlir).
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(
      %module: !transform.any_op {transform.readonly}) {
    %forwards = transform.structured.match ops{["attnres.forward"]} in %module
        : (!transform.any_op) -> !transform.any_op
    %tiled, %loops = transform.structured.tile_using_forall %forwards
        tile_sizes [16]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.yield
  }
}
