// Tiles every partition_reduce by 16 over its first token dimension and
// leaves the forwards whole (host-forward.test).
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(
      %module: !transform.any_op {transform.readonly}) {
    %merges = transform.structured.match ops{["attnres.partition_reduce"]}
        in %module : (!transform.any_op) -> !transform.any_op
    %tiled, %loops = transform.structured.tile_using_forall %merges
        tile_sizes [16]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.yield
  }
}
