func.func @forward_list(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>,
                        %v2: tensor<?x64xbf16>, %q: tensor<16xf32>)
    -> (tensor<?x64xbf16>, tensor<?xf32>) {
  %o, %lse = attnres.forward sources(%v0, %v1, %v2 : tensor<?x64xbf16>)
      query(%q : tensor<16xf32>) -> tensor<?x64xbf16>, tensor<?xf32>
  return %o, %lse : tensor<?x64xbf16>, tensor<?xf32>
}
