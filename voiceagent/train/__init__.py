"""Training data for a voice of our own (docs/training.md).

The pipeline runs in stages that each write into one work directory:

- `corpus` (corpus.py): English sentences, written and spoken form, split into train and
  held-out;
- `teacher` (teacher.py): the sentences spoken by a teacher voice (Piper, run as a
  separate program from its own venv), one WAV per sentence;

and later stages (speech tokens, LM, flow, vocoder, export) read what these write.
wer.py is the intelligibility meter (pocketsphinx) for teacher and student speech.
"""
