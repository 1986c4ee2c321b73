"""What a stored row is made of: the checks of records a store is given (``checks``), the
decoding of raw rows into records and the naming of damaged ones (``decode``), the text a
message is searched by (``text``) and its search tokens (``tokenizer``, ``signatures``)."""
