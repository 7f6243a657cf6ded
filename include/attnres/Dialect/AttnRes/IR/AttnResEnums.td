//===- AttnResEnums.td - attnres enumerations ---------------*- tablegen -*-===//

#ifndef ATTNRES_DIALECT_ATTNRES_IR_ATTNRESENUMS_TD
#define ATTNRES_DIALECT_ATTNRES_IR_ATTNRESENUMS_TD

include "mlir/IR/EnumAttr.td"

def AttnRes_SaveMode : I32EnumAttr<"SaveMode",
    "what attnres.forward keeps for attnres.backward", [
      I32EnumAttrCase<"OPre", 0, "o_pre">,
      I32EnumAttrCase<"Lse", 1, "lse">,
      I32EnumAttrCase<"OPreResidual", 2, "o_pre_residual">
    ]> {
  let cppNamespace = "::mlir::attnres";
}

def AttnRes_ReduceKind : I32EnumAttr<"ReduceKind",
    "how attnres.partition_reduce combines its partitions", [
      I32EnumAttrCase<"Softmax", 0, "softmax">,
      I32EnumAttrCase<"Sum", 1, "sum">
    ]> {
  let cppNamespace = "::mlir::attnres";
}

#endif // ATTNRES_DIALECT_ATTNRES_IR_ATTNRESENUMS_TD
