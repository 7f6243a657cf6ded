// Tiles every partition_reduce by [1, 16] (its first token dimension by 1,
// the second by 16) and leaves the forwards whole (keep-host-tile.mlir).
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(
      %module: !transform.any_op {transform.readonly}) {
    %merges = transform.structured.match ops{["attnres.partition_reduce"]}
        in %module : (!transform.any_op) -> !transform.any_op
    %tiled, %loops = transform.structured.tile_using_forall %merges
        tile_sizes [1, 16]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.yield
  }
}
