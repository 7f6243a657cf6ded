//===- BufferizableOpInterfaceImpl.h - bufferize the attnres ops -*- C++
//-*-===//
//
// One-shot bufferization of the attnres ops: each becomes its op on buffers
// (attnres.forward_into, attnres.backward_into,
// attnres.partition_reduce_into), reading its operands' buffers in place and
// writing its results into buffers the bufferization options allocate.
//
//===----------------------------------------------------------------------===//

#ifndef ATTNRES_DIALECT_ATTNRES_TRANSFORMS_BUFFERIZABLEOPINTERFACEIMPL_H
#define ATTNRES_DIALECT_ATTNRES_TRANSFORMS_BUFFERIZABLEOPINTERFACEIMPL_H

namespace mlir {
class DialectRegistry;

namespace attnres {
void registerBufferizableOpInterfaceExternalModels(DialectRegistry &registry);
} // namespace attnres
} // namespace mlir

#endif // ATTNRES_DIALECT_ATTNRES_TRANSFORMS_BUFFERIZABLEOPINTERFACEIMPL_H
