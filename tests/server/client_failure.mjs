// What a client call that should fail threw, for the client scripts of this folder: 'no error'
// when it returned, else what `describe` makes of the error.
export async function failure(call, describe) {
  try {
    await call();
    return 'no error';
  } catch (e) {
    return describe(e);
  }
}
