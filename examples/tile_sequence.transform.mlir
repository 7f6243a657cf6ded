// A transform dialect script for attnres-lower-to-{nvvm,rocdl}-pipeline's
// transform-library option (with keep-host=1): it tiles every forward of
// the module over its [batch, sequence] tokens into tiles of one sequence
// position range of 32 tokens with the upstream
// transform.structured.tile_using_forall, in place of attnres-tile. The
// kernels are then launched with one block per tile, as for
// attnres-tile's loops (docs/Pipeline.md).
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(
      %module: !transform.any_op {transform.readonly}) {
    %forwards = transform.structured.match ops{["attnres.forward"]} in %module
        : (!transform.any_op) -> !transform.any_op
    %tiled, %loops = transform.structured.tile_using_forall %forwards
        tile_sizes [1, 32]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.yield
  }
}
