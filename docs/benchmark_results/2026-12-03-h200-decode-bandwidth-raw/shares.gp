set terminal pngcairo size 1100,520 font "DejaVu Sans,11"
set output "2026-12-03-h200-decode-bandwidth.png"
set title "Decode on one H200: tg128 as a share of the memory-bandwidth limit (Llama-3.1-8B / Qwen2.5-7B shapes)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set yrange [0:1.15]
set ytics 0.1
set grid ytics
set ylabel "t/s / limit"
set key top right opaque box
set termoption noenhanced
plot "raw_dat" using 2:xtic(1) title "Osprey before (baeff3c)" lc rgb "#9ecae1", \
     "" using 3 title "Osprey now" lc rgb "#08519c", \
     "" using 4 title "llama.cpp (Aug 2026, flash attention)" lc rgb "#fdae6b", \
     0.87 with lines dt 2 lw 2 lc rgb "#444444" title "fp16 target 0.87", \
     0.60 with lines dt 3 lw 2 lc rgb "#444444" title "4-bit target 0.60"
