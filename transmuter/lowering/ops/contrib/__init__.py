"""com.microsoft operators (ONNX Runtime's contrib ops), as Hugging Face exports use them."""
